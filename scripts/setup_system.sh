#!/usr/bin/env bash
# The Debian packages that fastsac's optional extras need, installed when this runs as root on a
# machine with apt-get; elsewhere it names what is missing and the command that installs it. It
# never fails the bootstrap: the feature itself says what is missing when it is used.
#
#   video: headless OpenGL for MuJoCo's offscreen renderer (fastsac-eval --video): EGL (libegl1,
#          libopengl0, and libgl1-mesa-dri, Mesa's software renderer for a machine without a GPU)
#          and OSMesa (libosmesa6). The list lives in fastsac/tools/video.py (GL_BACKENDS).
#
# Usage: scripts/setup_system.sh PYTHON EXTRAS   (called by scripts/bootstrap.sh; quick when
# everything is installed: one dpkg-query per package)
set -euo pipefail
cd "$(dirname "$0")/.."
py="$1"
extras="$2"
case ",$extras," in
  *,video,*) ;;
  *) exit 0 ;;
esac
if [ "${FASTSAC_NO_SYSTEM_PACKAGES:-}" = 1 ]; then
  echo "setup_system: FASTSAC_NO_SYSTEM_PACKAGES=1: no Debian packages installed (fastsac-eval --video of MuJoCo tasks needs EGL or OSMesa)" >&2
  exit 0
fi
if ! command -v dpkg-query >/dev/null 2>&1; then
  echo "setup_system: not a Debian system: fastsac-eval --video of MuJoCo tasks needs EGL or OSMesa; install one yourself" >&2
  exit 0
fi
if ! packages=$("$py" -c 'from fastsac.tools.video import system_packages; print(" ".join(system_packages()))'); then
  echo "setup_system: cannot read the package list from fastsac/tools/video.py with $py (error above)" >&2
  exit 0
fi
missing=()
for p in $packages; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
cmd="apt-get install -y --no-install-recommends ${missing[*]}"
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "setup_system: fastsac-eval --video needs ${missing[*]} (headless OpenGL); install them as root: $cmd" >&2
  exit 0
fi
start=$SECONDS
apt=(apt-get install -y -qq --no-install-recommends -o DPkg::Lock::Timeout=300 -o Dpkg::Use-Pty=0 "${missing[@]}")
# the package lists of a fresh machine may be missing or old: update them only when needed
if ! out=$(DEBIAN_FRONTEND=noninteractive "${apt[@]}" 2>&1); then
  if ! out=$({ apt-get update -qq && DEBIAN_FRONTEND=noninteractive "${apt[@]}"; } 2>&1); then
    echo "setup_system: could not install ${missing[*]}; fastsac-eval --video will say what is missing" >&2
    echo "$out" | tail -n 5 >&2
    exit 0
  fi
fi
echo "setup_system: installed ${missing[*]} in $((SECONDS - start)) s" >&2
