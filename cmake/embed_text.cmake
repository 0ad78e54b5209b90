# Writes OUTPUT, a C++ file defining spin::kCalibrationJson as the text of INPUT.
file(READ ${INPUT} text)
file(WRITE ${OUTPUT} "// Generated from ${INPUT}; do not edit.\nnamespace spin {\nextern const char* const kCalibrationJson;\nconst char* const kCalibrationJson = R\"spin_embed(${text})spin_embed\";\n}  // namespace spin\n")
