#!/usr/bin/env bash
# test_prompt_cache.sh - salafw run --prompt-cache FILE end to end on tiny
# mkmodel models (CPU, greedy): the second run of a prompt takes the load
# path (its stderr says so, nothing prefilled) and prints what the first run
# and a run without the cache print; a prompt that extends the cached one
# loads it and prefills only the rest, then replaces FILE; a prompt that
# diverges prefills whole and replaces FILE. Every bad FILE (a flipped
# byte, truncated, empty, another model, other --dense-as-sparse, garbage, a
# symlink, a directory) gives exactly one warning line naming it and the
# uncached output; garbage and links are left as they are. A full disk or
# a kill while writing never leaves a partial FILE.
# Under SAN=1 the write shim (LD_PRELOAD) comes before the ASan runtime, and
# ASan must not refuse to start for that (as tests/test_quant.sh).
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}verify_asan_link_order=0"
. tests/lib.sh
S=$(mktemp -d "${TMPDIR:-/tmp}/salafw-pc.XXXXXX")
trap 'rm -rf "$S"' EXIT

if $SALAFW mkmodel --preset tiny -o "$S/t" >/dev/null 2>&1 &&
	$SALAFW mkmodel --preset tiny --seed 7 -o "$S/t7" >/dev/null 2>&1; then
	pass "mkmodel tiny, two seeds"
else
	fail "mkmodel tiny"
	check_report test_prompt_cache
	exit 1
fi
P="Once upon a time there was a little fox who lived in the forest"
Q="$P and every morning it ran to the river to drink"   # 44 tokens, P's 26 first
R="Twice upon a time there was a little fox who lived in the forest"
run() { $SALAFW run "$1" --no-verify --raw --temp 0 -n 12 "${@:2}"; }
C=$S/c.bin

# runs with the cache: stdout to $S/out, stderr to $S/err
crun() { run "$@" --prompt-cache "$C" >"$S/out" 2>"$S/err"; }
warnings() { grep -c "prompt cache '.*' \(ignored\|not used\|not saved\)" "$S/err"; }
same_out() { # DESCR WANT
	if [ "$(cat "$S/out")" = "$2" ]; then pass "$1"; else fail "$1: got '$(cat "$S/out")' want '$2'"; fi
}
has_err() { # DESCR PATTERN
	if grep -qE -- "$2" "$S/err"; then pass "$1"; else fail "$1: stderr $(tr '\n' ' ' <"$S/err" | head -c 400)"; fi
}
one_warning() { # DESCR PATTERN
	local n; n=$(warnings)
	if [ "$n" = 1 ] && grep -qE -- "warning: prompt cache '.*' .*$2" "$S/err"; then pass "$1"
	else fail "$1: $n warnings; stderr $(tr '\n' ' ' <"$S/err" | head -c 400)"; fi
}
no_tmp() { # no temporary file of the atomic writer left beside FILE
	if ls "$S" | grep -q '\.tmp\.'; then fail "$1: $(ls "$S" | grep '\.tmp\.')"; else pass "$1"; fi
}

plainP=$(run "$S/t" -p "$P" 2>/dev/null)
plainQ=$(run "$S/t" -p "$Q" 2>/dev/null)
plainR=$(run "$S/t" -p "$R" 2>/dev/null)
plain7=$(run "$S/t7" -p "$P" 2>/dev/null)
[ -n "$plainP" ] && [ "$plainP" != "$plain7" ] && pass "uncached outputs" || fail "uncached outputs '$plainP' '$plain7'"

# first run: prefills whole, saves; second: loads all of it, prefills nothing
crun "$S/t" -p "$P"
same_out "first run with the cache prints the uncached text" "$plainP"
has_err "first run saves FILE" "prompt cache: saved 26 tokens to '$C'"
[ -f "$C" ] && pass "FILE written" || fail "FILE written"
no_tmp "no temporary file after a save"
crun "$S/t" -p "$P"
same_out "second run (loaded) prints the same text" "$plainP"
has_err "second run takes the load path" "prompt cache: loaded 26 of 26 prompt tokens from '$C'"
has_err "second run prefills nothing" "prefill 0 tokens"
[ "$(warnings)" = 0 ] && ! grep -q "saved" "$S/err" && pass "an exact match neither warns nor rewrites" ||
	fail "exact match: $(cat "$S/err")"
# --print-ids (the same ids as the text run)
idsP=$(run "$S/t" -p "$P" --print-ids 2>/dev/null)
crun "$S/t" -p "$P" --print-ids
same_out "--print-ids with a loaded state" "$idsP"

# an extension: loads P's state, prefills the rest as one call, saves Q's.
# Under 64 tokens every call runs the Lightning recurrence token by token,
# dense attention and row-wise linears, so two calls compute what one does:
# the output equals the uncached one here (test_ctxstate checks longer
# prompts against the same two calls).
crun "$S/t" -p "$Q"
has_err "an extension loads the cached prefix" "loaded 26 of 44 prompt tokens"
has_err "an extension prefills only the rest" "prefill 18 tokens"
has_err "an extension saves the longer prompt" "saved 44 tokens"
# (the CPU's kernels; a CUDA build on a GPU runs these runs there)
grep -q '\[cpu\]' "$S/err" && same_out "an extension under 64 tokens prints the uncached text" "$plainQ"
crun "$S/t" -p "$Q"
has_err "the longer prompt then loads whole" "loaded 44 of 44"
same_out "... and prints the uncached text" "$plainQ"
# a prompt that diverges: prefilled whole, FILE replaced
crun "$S/t" -p "$R"
has_err "a diverging prompt: said so" "holds another prompt"
[ "$(warnings)" = 0 ] && pass "a diverging prompt is no warning" || fail "diverging: $(cat "$S/err")"
same_out "a diverging prompt prints the uncached text" "$plainR"
has_err "a diverging prompt rewrites FILE" "saved 27 tokens"
crun "$S/t" -p "$R"
has_err "... which then loads" "loaded 27 of 27"

# a prompt past dense_len (512): the sparse layers select blocks in the
# prompt's call; the loaded state is that call's
L=$(for i in $(seq 40); do printf '%s, ' "$P"; done)
plainL=$(run "$S/t" -p "$L" 2>/dev/null)
rm -f "$C"
crun "$S/t" -p "$L"
same_out "a long prompt, saved: uncached text" "$plainL"
crun "$S/t" -p "$L"
has_err "a long prompt loads" "loaded [0-9]{3,} of [0-9]{3,}"
same_out "a long prompt, loaded: uncached text" "$plainL"

# bad files: one warning naming FILE, the uncached output, FILE rewritten
crun "$S/t" -p "$P" # FILE = P's state
cp "$C" "$S/good.bin"
size=$(stat -c %s "$C")
for at in 20 300 $((size / 2)) $((size - 4)); do
	cp "$S/good.bin" "$C"
	printf '\x5a' | dd of="$C" bs=1 seek="$at" conv=notrunc 2>/dev/null
	cmp -s "$C" "$S/good.bin" && printf '\xa5' | dd of="$C" bs=1 seek="$at" conv=notrunc 2>/dev/null
	crun "$S/t" -p "$P"
	one_warning "a byte changed at $at: one warning" "ignored: .*(checksum|header)"
	same_out "a byte changed at $at: uncached text" "$plainP"
	has_err "a byte changed at $at: FILE rewritten" "saved 26 tokens"
done
cmp -s "$C" "$S/good.bin" && pass "the rewritten FILE is the state again" || fail "rewritten FILE differs"
for keep in 0 5 200 $((size / 2)) $((size - 1)); do
	head -c "$keep" "$S/good.bin" >"$C"
	crun "$S/t" -p "$P"
	one_warning "truncated to $keep bytes: one warning" "ignored: truncated"
	same_out "truncated to $keep bytes: uncached text" "$plainP"
done
cp "$S/good.bin" "$C"
crun "$S/t7" -p "$P"
one_warning "another model (mkmodel seed 7): one warning" "ignored: made for another model"
same_out "another model: its uncached text" "$plain7"
cp "$S/good.bin" "$C"
crun "$S/t" -p "$P" --dense-as-sparse
one_warning "another --dense-as-sparse: one warning" "ignored: made without --dense-as-sparse"
same_out "another --dense-as-sparse: its uncached text" "$(run "$S/t" -p "$P" --dense-as-sparse 2>/dev/null)"
head -c 3000 /dev/urandom >"$C"
cp "$C" "$S/garbage"
crun "$S/t" -p "$P"
one_warning "garbage: one warning" "not a salafw prompt cache"
same_out "garbage: uncached text" "$plainP"
cmp -s "$C" "$S/garbage" && pass "garbage is left as it is" || fail "garbage was overwritten"
rm -f "$C"
cp "$S/good.bin" "$S/target.bin"
ln -s "$S/target.bin" "$C"
crun "$S/t" -p "$Q"
one_warning "a symlink: one warning" "symlink"
same_out "a symlink: uncached text" "$plainQ"
[ -L "$C" ] && cmp -s "$S/good.bin" "$S/target.bin" && pass "the symlink and its target stay" ||
	fail "the symlink or its target changed"
rm -f "$C"
mkdir "$C"
crun "$S/t" -p "$P"
one_warning "a directory: one warning" "not a regular file"
same_out "a directory: uncached text" "$plainP"
rmdir "$C"
# a name with a newline and an escape: the warning stays one escaped line
N=$S/$'bad\nname\e[1m'
head -c 100 /dev/urandom >"$N"
run "$S/t" -p "$P" --prompt-cache "$N" >"$S/out" 2>"$S/err"
[ "$(grep -c "warning: prompt cache" "$S/err")" = 1 ] && ! grep -q $'\e' "$S/err" &&
	pass "an untrusted name is printed escaped, on one line" || fail "escaping: $(cat -v "$S/err")"

# a full disk or a kill while writing never leaves a partial FILE
WF=$S/writefault.so
if ${CC:-cc} -shared -fPIC -o "$WF" tests/shim/writefault.c -ldl 2>/dev/null; then
	rm -f "$C"
	LD_PRELOAD=$WF SFW_TEST_ENOSPC=c.bin.tmp run "$S/t" -p "$P" --prompt-cache "$C" >"$S/out" 2>"$S/err"
	one_warning "a full disk: one warning" "not saved"
	same_out "a full disk: the text all the same" "$plainP"
	[ ! -e "$C" ] && pass "a full disk leaves no FILE" || fail "a full disk left FILE"
	no_tmp "a full disk leaves no temporary file"
	cp "$S/good.bin" "$C"
	LD_PRELOAD=$WF SFW_TEST_KILL=c.bin.tmp run "$S/t" -p "$Q" --prompt-cache "$C" >/dev/null 2>&1
	cmp -s "$C" "$S/good.bin" && pass "a kill while writing leaves the old FILE whole" ||
		fail "a kill while writing changed FILE"
	rm -f "$S"/c.bin.tmp.*
else
	fail "cannot build the write wrapper (tests/shim/writefault.c)"
fi

# the binding: an unverified model's files by identity (a touched file
# makes FILE stale), a verified model's signed manifest
cp -r "$S/t" "$S/u"
rm -f "$C"
crun "$S/u" -p "$P"
crun "$S/u" -p "$P"
has_err "an unverified copy: loads" "loaded 26 of 26"
sleep 0.01; touch "$S/u/config.json"
crun "$S/u" -p "$P"
one_warning "a touched config.json: one warning" "ignored: made for another model"
same_out "a touched config.json: uncached text" "$plainP"
export SALAFW_STATE_DIR=$S/state
mkdir -p "$S/u/.salafw"
if $SALAFW keygen --pubkey-out "$S/k.pub" -s "$S/k.key" >/dev/null 2>&1 &&
	$SALAFW manifest "$S/u" --repo test/tiny --revision 0123456789abcdef0123456789abcdef01234567 \
		-P "$S/k.pub" -o "$S/u/.salafw/manifest.json" >/dev/null 2>&1 &&
	$SALAFW sign -s "$S/k.key" "$S/u/.salafw/manifest.json" >/dev/null 2>&1 &&
	$SALAFW verify "$S/u" -P "$S/k.pub" >/dev/null 2>&1; then
	vrun() { $SALAFW run "$S/u" --pubkey "$S/k.pub" --raw --temp 0 -n 12 -p "$P" --prompt-cache "$C" \
		>"$S/out" 2>"$S/err"; }
	vrun
	one_warning "verified: the --no-verify state is another binding" "ignored: made for another model"
	has_err "verified: saved" "saved 26 tokens"
	vrun
	has_err "verified: loads" "loaded 26 of 26"
	same_out "verified: uncached text" "$plainP"
	crun "$S/u" -p "$P"
	one_warning "the same folder under --no-verify: another binding" "ignored: made for another model"
else
	fail "signing a copy of the model"
fi

# --kv-cache fp8: its own binding (a bf16 state is not loaded into it), and
# its states load back to the uncached fp8 text (the CPU keeps the fp8
# values in float: kernels/ops.h)
plainF=$(run "$S/t" -p "$P" --kv-cache fp8 2>/dev/null)
[ -n "$plainF" ] && pass "an fp8 K/V run prints text" || fail "an fp8 K/V run"
crun "$S/t" -p "$P"
crun "$S/t" -p "$P" --kv-cache fp8
one_warning "fp8 K/V: a bf16 state is another binding" "ignored: made for another model"
has_err "fp8 K/V: saves its own state" "saved 26 tokens"
crun "$S/t" -p "$P" --kv-cache fp8
has_err "fp8 K/V: loads it" "loaded 26 of 26"
same_out "fp8 K/V: prints the uncached fp8 text" "$plainF"

check_exit "--prompt-cache with -i is a usage error" 2 $SALAFW run "$S/t" --no-verify -i --prompt-cache "$C"
check_report test_prompt_cache
