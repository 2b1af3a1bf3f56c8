#!/usr/bin/env bash
# Installs what `make test` and `make demo` need on Debian when it is missing:
# Java 17, the `zookeeper` package (its jars in /usr/share/java), python3 (>= 3.11)
# with venv support, make and procps. Runs apt-get as root, or through sudo.
set -euo pipefail

arch=$(dpkg --print-architecture 2>/dev/null || echo amd64)
need=()

if [ -n "${JAVA_HOME:-}" ] && [ -x "$JAVA_HOME/bin/java" ]; then
  :  # the caller chose a Java
elif [ ! -x "/usr/lib/jvm/java-17-openjdk-$arch/bin/java" ]; then
  need+=(openjdk-17-jre-headless)
fi
[ -f /usr/share/java/zookeeper.jar ] || need+=(zookeeper)
py=$(command -v python3 || true)
if [ -z "$py" ]; then
  need+=(python3 python3-venv)
else
  case "$(readlink -f "$py")" in
    /usr/bin/*) dpkg -s python3-venv >/dev/null 2>&1 || need+=(python3-venv) ;;  # Debian's python3 needs it for venv
  esac
fi
command -v make >/dev/null || need+=(make)
command -v ps >/dev/null || need+=(procps)
[ -f /etc/ssl/certs/ca-certificates.crt ] || need+=(ca-certificates)

if [ ${#need[@]} -gt 0 ]; then
  echo "installing system packages: ${need[*]}" >&2
  if [ "$(id -u)" -eq 0 ]; then
    SUDO=()
  elif command -v sudo >/dev/null; then
    SUDO=(sudo)
  else
    echo "error: need root (or sudo) to install: ${need[*]}" >&2
    exit 1
  fi
  "${SUDO[@]}" apt-get update -qq
  "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive \
    apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

if ! python3 -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
  echo "error: kvlease needs Python >= 3.11, python3 is $(python3 -V 2>&1)" >&2
  exit 1
fi
