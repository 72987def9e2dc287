#!/usr/bin/env bash
# Build dpone's compiled converter (the C files of src/dpone/preparation/native/: rowbinary.c
# with the value files values_*.c and their private header rowbinary.h) next to its loader.
# Needs a C compiler and OpenSSL's headers (Debian: gcc, libssl-dev). dpone runs without
# the library (the Python reference then converts alone, many times slower),
# but its tests need it, so scripts/bootstrap.sh stops if this fails.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=src/dpone/preparation/native
lib=$dir/_rowbinary.so
# Every .c file of the folder, in a fixed order so that the build is the same everywhere.
mapfile -t sources < <(LC_ALL=C ls "$dir"/*.c)
tmp="$lib.tmp.$$"
trap 'rm -f "$tmp"' EXIT
# Built to a temporary file and renamed, so a failed build never leaves a partial library.
"${CC:-cc}" -O2 -std=gnu11 -Wall -Wextra -Werror -shared -fPIC "${sources[@]}" -o "$tmp" -lcrypto
mv -f "$tmp" "$lib"
