# Writes OUTPUT, a header defining SPIN_GIT_COMMIT as the checkout's commit (with "-dirty" when the
# tree has uncommitted changes), at build time: run by a target on every build, it rewrites the
# header only when the text changes, so an unchanged commit recompiles nothing.
execute_process(COMMAND git rev-parse --short HEAD WORKING_DIRECTORY ${SOURCE_DIR}
                OUTPUT_VARIABLE commit OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
if(NOT commit)
  set(commit "unknown")
else()
  execute_process(COMMAND git status --porcelain --untracked-files=no WORKING_DIRECTORY ${SOURCE_DIR}
                  OUTPUT_VARIABLE changes OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
  if(changes)
    set(commit "${commit}-dirty")
  endif()
endif()
set(text "// Generated at build time by cmake/git_commit.cmake; do not edit.\n#define SPIN_GIT_COMMIT \"${commit}\"\n")
set(old "")
if(EXISTS ${OUTPUT})
  file(READ ${OUTPUT} old)
endif()
if(NOT old STREQUAL text)
  file(WRITE ${OUTPUT} "${text}")
endif()
