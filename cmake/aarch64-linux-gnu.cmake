# Cross build for 64-bit Arm Linux on an x86-64 Debian host (the `aarch64` preset; run by
# scripts/test-integration.sh): Debian's g++-aarch64-linux-gnu, the arm64 libraries installed
# multiarch (libfmt-dev:arm64, libgtest-dev:arm64; the header-only ones are shared), and every
# target program — gtest discovery, ctest — run under qemu-user, so the whole suite runs here.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)
# Multiarch: find_package looks in /usr/lib/aarch64-linux-gnu/cmake, never at the host's libraries.
set(CMAKE_LIBRARY_ARCHITECTURE aarch64-linux-gnu)
find_program(SPIN_QEMU_AARCH64 NAMES qemu-aarch64-static qemu-aarch64 REQUIRED)
# The arm64 loader and libraries live in / (multiarch), so qemu needs no -L prefix.
set(CMAKE_CROSSCOMPILING_EMULATOR ${SPIN_QEMU_AARCH64})
