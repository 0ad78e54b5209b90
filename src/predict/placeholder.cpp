// placeholder until the predictor sources land
