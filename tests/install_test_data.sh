#!/usr/bin/env bash
# The one data set the tests read that pip cannot bring: the real Fashion-MNIST files, from Debian's
# dataset-fashion-mnist (the loader's real-data tests fail without them, naming the package). Needs root
# (or sudo) the first time; a no-op once the package is installed.
set -euo pipefail
if ! dpkg -s dataset-fashion-mnist >/dev/null 2>&1; then
    sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    $sudo apt-get update -qq
    $sudo apt-get install -y -qq dataset-fashion-mnist
fi
