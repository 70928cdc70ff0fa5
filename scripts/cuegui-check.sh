#!/usr/bin/env bash
# CueGUI and CueSubmit, OpenCue's own GUI clients, against `cuectl serve --opencue` for real
# (issue 34): scripts/cuegui_check.py under Xvfb drives Cuetopia's job monitor, frame
# monitor and log viewer and CueCommander's host monitor on a running GPU job (a real worker
# on fake GPUs), submits through CueSubmit's submission function, and takes screenshots
# (docs/images/cuegui-*.png; --screenshots DIR puts them elsewhere). Exits non-zero naming
# the first check that failed.
#
# What it installs when missing: Xvfb and the X libraries PySide6's Qt needs (apt-get, as
# root only, saying so first; otherwise it names them and stops), and the GUI clients
# (PySide6, opencue-cuegui, opencue-cuesubmit, pinned) with cuectl itself (editable, this
# checkout) into their own venv, .venv-cuegui, beside .venv: never into .venv, so the main
# suite's environment stays small. Safe to run again: it installs only what is missing.
# --install-only: install, run nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=.venv-cuegui
PINS=(PySide6==6.5.3 opencue-cuegui==1.37.0 opencue-cuesubmit==1.37.0)
# Debian's names: Xvfb (xvfb-run needs xauth), a font, and what PySide6 6.5's xcb platform
# plugin and QtGui link or load (found by ldd on its libraries and by running it: on a
# Debian image without X, libxcb-icccm4 and libxcb-keysyms1 are the usual missing ones).
APT=(xvfb xauth fonts-dejavu-core libxkbcommon0 libxkbcommon-x11-0 libxcb1 libx11-xcb1
     libxcb-cursor0 libxcb-icccm4 libxcb-keysyms1 libxcb-image0 libxcb-render-util0
     libxcb-randr0 libxcb-shape0 libxcb-shm0 libxcb-sync1 libxcb-xfixes0 libxcb-xkb1
     libxcb-glx0 libegl1 libgl1 libfontconfig1 libfreetype6 libdbus-1-3 libglib2.0-0)

install_only=0
if [ "${1:-}" = --install-only ]; then install_only=1; shift; fi

missing=()
if command -v dpkg-query >/dev/null; then
  for pkg in "${APT[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
  done
else
  command -v xvfb-run >/dev/null || missing+=(xvfb)  # not Debian: Qt names any other missing library
fi
if [ "${#missing[@]}" -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "scripts/cuegui-check.sh: installing ${missing[*]} for CueGUI under Xvfb (apt-get)" >&2
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  else
    echo "scripts/cuegui-check.sh: missing ${missing[*]}: install them with" \
         "'sudo apt-get install ${missing[*]}' (Debian/Ubuntu) and run this again" >&2
    exit 2
  fi
fi

# The venv is up to date when it has the pinned clients and imports cuectl from this checkout.
ready() {
  [ -x "$VENV/bin/python" ] && "$VENV/bin/python" - "$PWD/src" "${PINS[@]}" <<'EOF' 2>/dev/null
import sys
from importlib import metadata
import cuectl, grpc, opencue_proto  # noqa: F401  (cuectl[opencue])
src = sys.argv[1]
assert cuectl.__file__.startswith(src + "/"), cuectl.__file__
for pin in sys.argv[2:]:
    name, version = pin.split("==")
    assert metadata.version(name) == version, pin
EOF
}
if ! ready; then
  echo "scripts/cuegui-check.sh: installing ${PINS[*]} and cuectl[opencue] into $VENV" >&2
  [ -x "$VENV/bin/python" ] || "${PYTHON:-python3}" -m venv "$VENV"
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check -e ".[opencue]" "${PINS[@]}"
  ready || { echo "scripts/cuegui-check.sh: $VENV is still not usable after installing" >&2; exit 2; }
fi
[ "$install_only" = 1 ] && exit 0

# A screen large enough for the screenshots' windows; -a picks a free display number.
exec xvfb-run -a -s "-screen 0 1600x1000x24 -nolisten tcp" "$VENV/bin/python" scripts/cuegui_check.py "$@"
