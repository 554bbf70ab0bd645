#!/usr/bin/env bash
# apt_install.sh COMMAND PACKAGE NEED: install Debian's PACKAGE unless COMMAND is on PATH. As root with
# apt-get it is installed here; otherwise, or when apt-get fails, one line says what NEEDS it and how,
# and the caller goes on (only what needs it fails or is skipped without it).
set -uo pipefail
command="$1" package="$2" need="$3"
command -v "$command" >/dev/null && exit 0
if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null; then
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$package") >/dev/null \
    || echo "apt-get could not install $package; $need"
else
  echo "$package ($command) is not installed; $need: sudo apt-get install $package"
fi
