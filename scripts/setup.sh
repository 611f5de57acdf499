#!/usr/bin/env bash
# Installs what salafw needs on a fresh Debian 12 machine (idempotent).
set -eu
# libclang-rt-14-dev: the libFuzzer runtime (only recommended by clang, and
# recommendations are not installed)
pkgs="build-essential pkg-config clang libclang-rt-14-dev git libcurl4-openssl-dev libsodium-dev libssl-dev libcjson-dev libunistring-dev
libsentencepiece-dev libmicrohttpd-dev python3-venv sentencepiece minisign nginx-light curl aria2 python3 coreutils openssl procps bc
man-db groff-base bsdutils python3-pyte"
# python3-jinja2: tests/test_chat_template.sh renders chat templates with it (the peer of formats/jinja.c)
pkgs="$pkgs python3-jinja2"
# strace: tests/test_get_sched.sh checks the order of fsync and rename from its record
pkgs="$pkgs strace"
# universal-ctags: tests/test_house.sh measures every function's length with it
pkgs="$pkgs universal-ctags"
missing=
for p in $pkgs; do dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"; done
if [ -n "$missing" ]; then
	echo "setup: installing$missing"
	SUDO=; [ "$(id -u)" = 0 ] || SUDO=sudo
	$SUDO apt-get update -qq
	DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends $missing >/dev/null
fi
# A package install may start the distribution's nginx; tests run their own.
if command -v service >/dev/null 2>&1; then service nginx stop >/dev/null 2>&1 || true; fi
# tests/test_serve.sh drives `salafw serve` with the real `openai` client
# from PyPI, in a virtual environment of its own.
VENV=${SALAFW_TEST_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/salafw/venv}
if ! "$VENV/bin/python3" -c 'import openai' >/dev/null 2>&1; then
	echo "setup: the openai client into $VENV"
	python3 -m venv "$VENV"
	"$VENV/bin/pip" install -q --disable-pip-version-check openai
fi
echo "setup: all dependencies present"
