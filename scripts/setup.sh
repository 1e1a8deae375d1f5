#!/usr/bin/env bash
# One-shot, idempotent set-up for ibgda-nic on Debian 12 (run as root).
#  1. Debian packages: Icarus Verilog, Verilator build dependencies, tshark.
#  2. Verilator >= 5.036 built from Debian's source package into a per-user
#     cache folder (shared by every clone on the machine), unless one exists.
#  3. A Python virtual environment (.venv) with the project's packages.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
VERILATOR_VERSION=${VERILATOR_VERSION:-5.048}
VERILATOR_MIN=5.036
CACHE=${IBGDA_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/ibgda-nic}
VPREFIX="$CACHE/verilator-$VERILATOR_VERSION"
VENV="$ROOT/.venv"
PY=${PYTHON:-python3}

say() { printf '\n==> %s\n' "$*"; }

SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi

# ---- 1. Debian packages -----------------------------------------------------
APT_PKGS=(iverilog make g++ flex bison autoconf help2man libfl-dev perl
          python3-venv ca-certificates tshark)
missing=()
for p in "${APT_PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  say "installing Debian packages: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  echo "wireshark-common wireshark-common/install-setuid boolean false" | $SUDO debconf-set-selections || true
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  say "Debian packages already installed"
fi

# ---- 2. Verilator -------------------------------------------------------------
version_ge() { [ "$(printf '%s\n%s\n' "$2" "$1" | sort -V | head -n1)" = "$2" ]; }
have_verilator() {
  local bin=$1 v
  [ -x "$bin" ] || return 1
  v=$("$bin" --version 2>/dev/null | awk '{print $2}')
  [ -n "$v" ] && version_ge "$v" "$VERILATOR_MIN"
}
if have_verilator "$VPREFIX/bin/verilator"; then
  say "Verilator found in $VPREFIX ($("$VPREFIX/bin/verilator" --version))"
elif command -v verilator >/dev/null && have_verilator "$(command -v verilator)"; then
  say "Verilator on PATH is recent enough ($(verilator --version))"
else
  say "building Verilator $VERILATOR_VERSION from Debian's source package into $VPREFIX (6-12 minutes)"
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
     || apt-get "${APTOPT[@]}" source --download-only verilator)
  tarball=$(ls "$work"/src/verilator_*.orig.tar.* | head -n1)
  tar -xf "$tarball" -C "$work/src"
  srcdir=$(find "$work/src" -maxdepth 1 -type d -name 'verilator*' | head -n1)
  cd "$srcdir"
  unset VERILATOR_ROOT
  autoconf
  ./configure --prefix="$VPREFIX" >/dev/null
  make -j"$(nproc)" >/dev/null
  make install >/dev/null
  cd "$ROOT"
  have_verilator "$VPREFIX/bin/verilator" || { echo "Verilator build failed" >&2; exit 1; }
  say "Verilator installed: $("$VPREFIX/bin/verilator" --version)"
fi

# ---- 3. Python environment ----------------------------------------------------
if [ ! -x "$VENV/bin/python" ]; then
  say "creating virtual environment $VENV"
  "$PY" -m venv "$VENV"
fi
say "installing Python packages into $VENV"
"$VENV/bin/pip" install -q --upgrade pip
"$VENV/bin/pip" install -q -e "$ROOT[dev]"
say "setup complete"
"$VENV/bin/python" -c "import amaranth, cocotb, scapy; print('amaranth', amaranth.__version__, '| cocotb', cocotb.__version__)"
iverilog -V 2>/dev/null | head -n1
