# Writes OUTPUT, a C++ file defining spin::<NAME> (default kCalibrationJson) as the text of INPUT.
if(NOT DEFINED NAME)
  set(NAME kCalibrationJson)
endif()
file(READ ${INPUT} text)
file(WRITE ${OUTPUT} "// Generated from ${INPUT}; do not edit.\nnamespace spin {\nextern const char* const ${NAME};\nconst char* const ${NAME} = R\"spin_embed(${text})spin_embed\";\n}  // namespace spin\n")
