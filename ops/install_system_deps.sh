#!/usr/bin/env bash
# Installs Java 17 and the Debian `zookeeper` package when they are missing.
set -euo pipefail
need=()
[ -x /usr/lib/jvm/java-17-openjdk-amd64/bin/java ] || command -v java >/dev/null || need+=(openjdk-17-jre-headless)
[ -f /usr/share/java/zookeeper.jar ] || need+=(zookeeper)
if [ ${#need[@]} -gt 0 ]; then
  echo "installing system packages: ${need[*]}" >&2
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >/dev/null
fi
python3 -c 'import venv' 2>/dev/null || { SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"; DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq python3-venv >/dev/null; }
