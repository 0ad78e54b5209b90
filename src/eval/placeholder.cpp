// placeholder until the eval sources land
