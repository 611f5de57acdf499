#!/usr/bin/env bash
# test_run_pty.sh - `salafw run -i` as a chat tool under a pseudo-terminal
# (tests/run/pty_chat.py, python3's pty module), on a generated tiny model:
# Ctrl-C mid-reply stops the reply and returns to the prompt with the
# history kept (each later turn prefills only its own tokens onto the whole
# context before it, the stopped reply's tokens included: the stats lines'
# counts add up), a Ctrl-C at the prompt ends with 130, Ctrl-D with 0. What
# a later turn prefills is the template's text for the turn (its close of
# the stopped reply and the new user turn), counted independently by a
# --raw run of that text.
set -u
cd "$(dirname "$0")/.."
. tests/lib.sh
S=$(scratch)
M=$S/tiny
$SALAFW mkmodel --preset tiny -o "$M" >/dev/null 2>&1 || fail "mkmodel tiny"
# replies run to the context's end (--ignore-eos, -n 0) unless stopped
RUN="$SALAFW run $M --no-verify -i -n 0 --ignore-eos -c 60000 --seed 5"

timeout -k 5 180 python3 tests/run/pty_chat.py ctrlc -- $RUN >"$S/c.out" 2>&1
cat "$S/c.out" | sed 's/^/  /'
v() { sed -nE "s/^stats $1 .*$2=([0-9a-z]+).*/\1/p" "$S/c.out"; }
c1=$(v 1 context) p2=$(v 2 prefill) d2=$(v 2 decode) c2=$(v 2 context) p3=$(v 3 prefill) d3=$(v 3 decode) c3=$(v 3 context)
check "three replies, each stopped by Ctrl-C (finish cancel)" test "$(grep -c 'finish=cancel' "$S/c.out")" = 3
if [ -n "$c1" ] && [ -n "$c2" ] && [ -n "$c3" ] && [ "$c2" = $((c1 + p2 + d2)) ] && [ "$c3" = $((c2 + p3 + d3)) ] &&
	[ "$p2" -lt "$c1" ] && [ "$p3" -lt "$c2" ]; then
	pass "after each Ctrl-C the history stays: turn 2 prefills $p2 onto $c1, turn 3 $p3 onto $c2 (context $c3)"
else fail "history after Ctrl-C: $(tr '\n' ' ' <"$S/c.out")"; fi
check "Ctrl-C at the prompt ends the chat with exit 130" grep -qx 'exit 130' "$S/c.out"

# turn 2 feeds the stopped reply's last token, then the template's close and
# the new turn: as many tokens as --raw prefills for that text (BOS for the token)
printf '<|im_end|>\n<|im_start|>user\nTell me more<|im_end|>\n<|im_start|>assistant\n' >"$S/turn2.txt"
$SALAFW run "$M" --no-verify --raw -f "$S/turn2.txt" -n 1 2>"$S/t2.err" >/dev/null
want=$(sed -nE 's/.*prefill ([0-9]+) tokens.*/\1/p' "$S/t2.err")
[ -n "$want" ] && [ "$want" = "$p2" ] && pass "turn 2 prefilled the stopped reply's last token + the template's next turn ($p2)" ||
	fail "turn 2 prefill $p2, want $want"

timeout -k 5 120 python3 tests/run/pty_chat.py ctrld -- $RUN >"$S/d.out" 2>&1
check "Ctrl-D at the prompt ends the chat with exit 0 (after a stopped reply)" grep -qx 'exit 0' "$S/d.out"
check "... and that reply's stats said finish cancel" grep -q 'stats 1 .*finish=cancel' "$S/d.out"

check_report test_run_pty
