#!/usr/bin/env bash
# Build dpone's compiled converter (src/dpone/preparation/native/rowbinary.c) next to its loader.
# Needs a C compiler and OpenSSL's headers (Debian: gcc, libssl-dev). dpone runs without
# the library (the Python reference then converts alone, many times slower),
# but its tests need it, so scripts/bootstrap.sh stops if this fails.
set -euo pipefail
cd "$(dirname "$0")/.."
src=src/dpone/preparation/native/rowbinary.c
lib=src/dpone/preparation/native/_rowbinary.so
tmp="$lib.tmp.$$"
trap 'rm -f "$tmp"' EXIT
"${CC:-cc}" -O2 -std=gnu11 -Wall -Wextra -Werror -shared -fPIC "$src" -o "$tmp" -lcrypto
mv -f "$tmp" "$lib"
