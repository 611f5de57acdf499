#!/usr/bin/env bash
# test_layers.sh - the modules' dependency order of the Makefile (MODULES, in
# link order: a module may use only those after it) holds in the sources: no
# file of a module includes a header of a module before it (so kernels/,
# runner/, formats/ and num/ never include quant/ or tools/), and only links
# whose modules include tools/ get the SentencePiece trainer library.
set -u
cd "$(dirname "$0")/.."
. tests/lib.sh

read -r -a MODS <<<"$(sed -n 's/^MODULES := //p' Makefile)"
check "MODULES read from the Makefile" test "${#MODS[@]}" -ge 8

# upward_includes ROOT: prints "file: line" for every include of a module
# above the file's own module, under ROOT (the tree, or a test tree).
upward_includes() {
	local root=$1 i j
	for ((i = 0; i < ${#MODS[@]}; i++)); do
		[ -d "$root/${MODS[i]}" ] || continue
		for ((j = 0; j < i; j++)); do
			grep -rnE "^[[:space:]]*#[[:space:]]*include[[:space:]]+\"${MODS[j]}/" "$root/${MODS[i]}" \
				--include='*.c' --include='*.h' --include='*.cpp' --include='*.cu' --include='*.cuh' |
				sed "s|^$root/||"
		done
	done
}

# The checker finds a planted upward include (else the check below proves nothing).
T=$(scratch)
mkdir -p "$T/kernels" "$T/quant" "$T/num"
printf '#include "quant/quant.h"\n' >"$T/kernels/x.c"
printf '#include "num/num.h"\n' >"$T/quant/y.c"
printf '  #  include "tools/tools.h"\n' >"$T/num/z.h"
out=$(upward_includes "$T")
check "a planted kernels -> quant include is found" grep -q '^kernels/x.c:1:' <<<"$out"
check "a planted num -> tools include is found (spaces in the directive)" grep -q '^num/z.h:1:' <<<"$out"
check "a downward include (quant -> num) is not flagged" test "$(wc -l <<<"$out")" = 2

out=$(upward_includes .)
[ -z "$out" ] && pass "no module includes a module above it" || fail "upward includes: $out"
out=$(grep -rn '"quant/' kernels runner formats num 2>/dev/null)
[ -z "$out" ] && pass "kernels, runner, formats and num name no quant/ header" || fail "quant/ named: $out"

# -lsentencepiece_train: on the links of the CLI and of tests whose modules
# include tools, on no other (dry runs: -W marks the test source as changed).
# (a recipe line continued with a backslash is joined first)
link() {
	make -s -n -W "tests/$1.c" BUILD="$BUILD" "$BUILD/tests/$1" 2>/dev/null |
		sed -e ':a' -e '/\\$/N; s/\\\n//; ta' | grep -E " -o $BUILD/tests/$1 "
}
l=$(link test_tokenizer)
check "test_tokenizer (modules with tools) links" test -n "$l"
check "test_tokenizer links the trainer" grep -q -- '-lsentencepiece_train' <<<"$l"
l=$(link test_safetensors)
check "test_safetensors (no tools) links" test -n "$l"
check "test_safetensors does not link the trainer" test -z "$(grep -- '-lsentencepiece_train' <<<"$l")"
l=$(link test_batch)
check "test_batch (the engine, no tools) links without the trainer" \
	test -n "$l" -a -z "$(grep -- '-lsentencepiece_train' <<<"$l")"
check "the trainer's only user is tools/spm_train.cpp" \
	test "$(grep -rl 'sentencepiece_trainer\.h' --include='*.c' --include='*.h' --include='*.cpp' . | sort)" = ./tools/spm_train.cpp

check_report test_layers
