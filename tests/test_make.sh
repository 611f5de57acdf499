#!/usr/bin/env bash
# test_make.sh - the Makefile rebuilds the CUDA objects when CUDA_ARCH
# changes. The objects depend on $(BUILD)/.cuda-arch, which holds the
# architectures and is rewritten (made newer) when a build asks for others.
# (The stamp of before was made by a rule, and under .SECONDARY a missing
# stamp never forced the rebuild: a build for sm_90 after one for every
# architecture kept the fat objects.) Checked with make -n on a scratch build
# folder and a stand-in object; nvcc is not run, so this runs without CUDA.
set -u
cd "$(dirname "$0")/.."
CHECK_VERBOSE=${CHECK_VERBOSE-1}
. tests/lib.sh

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
B=$tmp/b
obj=$B/kernels/elementwise.cu.o
plan() { make -n CUDA=1 CUDA_ARCH="$1" BUILD="$B" "$obj" 2>&1; }

plan sm_90 >"$tmp/p1"
if grep -q "code=sm_90" "$tmp/p1" && [ "$(cat "$B/.cuda-arch" 2>/dev/null)" = sm_90 ]; then
	pass "make: a first build for sm_90 compiles for sm_90 and writes the stamp"
else
	fail "make: a first build for sm_90: $(head -c 300 "$tmp/p1"), stamp '$(cat "$B/.cuda-arch" 2>/dev/null)'"
fi
# the object built (a stand-in), newer than its source and the stamp
mkdir -p "$B/kernels" && sleep 1 && touch "$obj"
plan sm_90 >"$tmp/p2"
if grep -q nvcc "$tmp/p2"; then
	fail "make: the same architectures rebuild an object that is up to date"
else
	pass "make: the same architectures leave an up-to-date object alone"
fi
sleep 1
plan "sm_80 sm_90" >"$tmp/p3"
if grep -q "code=sm_80" "$tmp/p3" && [ "$(cat "$B/.cuda-arch")" = "sm_80 sm_90" ]; then
	pass "make: other architectures rebuild the object (stamp rewritten)"
else
	fail "make: other architectures did not rebuild the object: $(head -c 300 "$tmp/p3")"
fi
sleep 1 && touch "$obj"
plan sm_90 >"$tmp/p4"
if grep -q "code=sm_90" "$tmp/p4" && ! grep -q "code=sm_80" "$tmp/p4"; then
	pass "make: back to sm_90 rebuilds for sm_90 only"
else
	fail "make: back to sm_90: $(head -c 300 "$tmp/p4")"
fi
check_report test_make
