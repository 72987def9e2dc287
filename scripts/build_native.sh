#!/usr/bin/env bash
# Build dpone's compiled parts next to their loaders:
# - the converter (the C files of src/dpone/preparation/native/: rowbinary.c with the value
#   files values_*.c and their private header rowbinary.h), a ctypes library;
# - the renderer (src/dpone/exporters/native/: render.c and sqlite_rows.c with render.h), a
#   CPython extension module for the Python that runs this script ($PYTHON, else python3),
#   named with that interpreter's extension suffix (_render.cpython-311-x86_64-linux-gnu.so).
# Needs a C compiler, OpenSSL's and SQLite's headers and the Python headers (Debian: gcc,
# libssl-dev, libsqlite3-dev; python3-dev for Debian's own Python). dpone runs without
# either library (the Python reference then converts, and the Python renderer renders,
# alone, many times slower), but its tests need them, so scripts/bootstrap.sh stops if
# this fails.
set -euo pipefail
cd "$(dirname "$0")/.."
python="${PYTHON:-python3}"

# Compiles "$@" into $out through a temporary file renamed into place, so that a failed
# build never leaves a partial library.
build() {
    local out=$1
    shift
    local tmp="$out.tmp.$$"
    trap "rm -f '$tmp'" EXIT
    "${CC:-cc}" -O2 -std=gnu11 -Wall -Wextra -Werror -shared -fPIC "$@" -o "$tmp"
    mv -f "$tmp" "$out"
    trap - EXIT
}

# Every .c file of a folder, in a fixed order so that the build is the same everywhere.
dir=src/dpone/preparation/native
mapfile -t sources < <(LC_ALL=C ls "$dir"/*.c)
build "$dir/_rowbinary.so" "${sources[@]}" -lcrypto

dir=src/dpone/exporters/native
include=$("$python" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
suffix=$("$python" -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')
[ -f "$include/Python.h" ] || { echo "no Python.h in $include (install python3-dev)" >&2; exit 1; }
mapfile -t sources < <(LC_ALL=C ls "$dir"/*.c)
build "$dir/_render$suffix" -I"$include" "${sources[@]}" -lsqlite3
