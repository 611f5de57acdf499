#!/usr/bin/env bash
# test_generate.sh - salafw run as a generation front end, on a generated tiny
# model with its tokenizer: the printed seed repeats a run, --stop ends the
# text where the stop string starts, -f reads the prompt, -c bounds the
# context, and -i chats (stdin script and a pty through script(1)) with the
# history kept in the context: turn 2 prefills only its own tokens. -p is a
# user turn in the model's chat template (what tests/chat/render.py renders
# with python3-jinja2 is what gets prefilled), --raw plain text; special
# tokens show only with --special; -m and --temperature as llama.cpp users
# type them; generation_config.json sets the sampling defaults.
# (tests/test_run_pty.sh: Ctrl-C in -i under a pseudo-terminal.)
. tests/lib.sh
S=$(scratch)
M=$S/tiny
$SALAFW mkmodel --preset tiny -o "$M" >/dev/null 2>&1 || fail "mkmodel tiny"
R="$SALAFW run $M --no-verify"

# the seed: random unless given, printed with the stats; the printed one repeats the run
# (--ignore-eos: a random seed may draw EOS early, and the stats below expect 16 tokens)
a=$($R -p "Hello world" -n 16 --ignore-eos 2>"$S/a.err")
seed=$(sed -nE 's/.*, seed ([0-9]+)$/\1/p' "$S/a.err")
b=$($R -p "Hello world" -n 16 --ignore-eos --seed "$seed" 2>/dev/null)
$R -p "Hello world" -n 16 --ignore-eos 2>"$S/c.err" >/dev/null
seed2=$(sed -nE 's/.*, seed ([0-9]+)$/\1/p' "$S/c.err")
[ -n "$seed" ] && [ -n "$a" ] && [ "$a" = "$b" ] && pass "the printed seed $seed repeats the output" ||
	fail "seed '$seed': '$a' vs '$b'"
[ -n "$seed2" ] && [ "$seed2" != "$seed" ] && pass "without --seed the seed is random ($seed, $seed2)" ||
	fail "two runs without --seed printed '$seed' and '$seed2'"
grep -qE "prefill [0-9]+ tokens .*decode 15 tokens .* 16 generated, finish length, context [0-9]+ tokens, seed" \
	"$S/a.err" && pass "stats: prefill, decode, generated count, finish, context, seed" ||
	fail "stats line: $(cat "$S/a.err")"

# -f FILE is -p with the file's text
printf 'Hello world' > "$S/prompt.txt"
f=$($R -f "$S/prompt.txt" -n 16 --ignore-eos --seed "$seed" 2>/dev/null)
[ "$f" = "$a" ] && pass "-f FILE gives what -p gives" || fail "-f: '$f' vs '$a'"
# the llama.cpp spellings: --file, --n-predict, --ctx-size are -f, -n, -c
lf=$($R --file "$S/prompt.txt" --n-predict 16 --ignore-eos --seed "$seed" 2>/dev/null)
[ -n "$lf" ] && [ "$lf" = "$a" ] && pass "--file FILE --n-predict 16 gives what -p -n 16 gives" || fail "--file/--n-predict: '$lf' vs '$a'"
$R --raw -p "Hello world" --ctx-size 12 -n 100 --seed 1 2>"$S/cs12.err" >/dev/null
grep -q "finish length, context 12 tokens" "$S/cs12.err" && pass "--ctx-size 12 is -c 12" || fail "--ctx-size 12: $(cat "$S/cs12.err")"
check_err "-f of a missing file exits 5" 5 "^salafw run: --file: cannot open" $R -f "$S/none.txt" -n 2

# --stop: a piece of the reference text from its middle (python picks 3
# characters at the first place they occur); the output must end just before it
ref=$($R -p "Hello world" -n 40 --seed 9 --ignore-eos 2>/dev/null)
printf '%s' "$ref" > "$S/ref.txt"
python3 - "$S/ref.txt" "$S/stop.txt" "$S/want.txt" <<'PY'
import sys
t = open(sys.argv[1], encoding='utf-8', errors='strict').read()
for i in range(len(t) // 3, len(t) - 3):
    s = t[i:i + 3]
    if s.strip() == s and s and t.find(s) == i:
        open(sys.argv[2], 'w', encoding='utf-8').write(s)
        open(sys.argv[3], 'w', encoding='utf-8').write(t[:i])
        break
PY
stop=$(cat "$S/stop.txt")
got=$($R -p "Hello world" -n 40 --seed 9 --ignore-eos --stop "never-matches" --stop "$stop" 2>"$S/stop.err")
printf '%s' "$got" > "$S/got.txt"
if [ -n "$stop" ] && cmp -s "$S/got.txt" "$S/want.txt" && grep -q "finish stop" "$S/stop.err"; then
	pass "--stop '$stop' ends the text where it first starts"
else fail "--stop '$stop': got '$got' want '$(cat "$S/want.txt")' ($(cat "$S/stop.err"))"; fi
check_err "--stop '' is a usage error" 2 "^salafw run: --stop wants" $R -p x --stop ""

# -c: the prompt must fit; the reply stops at the context's end
check_err "-c smaller than the prompt" 5 "does not fit the context of 3" $R -p "Hello world" -c 3 -n 4
$R --raw -p "Hello world" -c 12 -n 100 --seed 1 2>"$S/c12.err" >/dev/null
grep -q "finish length, context 12 tokens" "$S/c12.err" && pass "-c 12 stops the reply at 12 positions" ||
	fail "-c 12: $(cat "$S/c12.err")"

# -i from a stdin script: two turns, a visible prompt each, turn 2 prefills only its own tokens
out=$(printf 'Hi there\nTell me more\n' | $R -i -n 6 --seed 4 2>"$S/i.err")
n_prompts=$(printf '%s' "$out" | grep -c '^> ')
[ "$n_prompts" = 3 ] && pass "-i shows the '> ' prompt before each turn (and at the end)" ||
	fail "-i prompts: $n_prompts in '$out'"
mapfile -t L < <(grep -E '^salafw run: prefill' "$S/i.err")
p1=$(echo "${L[0]}" | sed -nE 's/.*prefill ([0-9]+) tokens.*/\1/p')
c1=$(echo "${L[0]}" | sed -nE 's/.*context ([0-9]+) tokens.*/\1/p')
p2=$(echo "${L[1]}" | sed -nE 's/.*prefill ([0-9]+) tokens.*/\1/p')
d2=$(echo "${L[1]}" | sed -nE 's/.*decode ([0-9]+) tokens.*/\1/p')
c2=$(echo "${L[1]}" | sed -nE 's/.*context ([0-9]+) tokens.*/\1/p')
if [ ${#L[@]} = 2 ] && [ -n "$p2" ] && [ "$p2" -lt "$c1" ] && [ "$c2" = $((c1 + p2 + d2)) ]; then
	pass "-i turn 2 prefills $p2 new tokens onto the $c1 kept (turn 1 prefilled $p1), context $c2"
else fail "-i turn counts: $(cat "$S/i.err")"; fi
# the same conversation, replayed: the seed fixes both replies
out2=$(printf 'Hi there\nTell me more\n' | $R -i -n 6 --seed 4 2>/dev/null)
[ "$out" = "$out2" ] && pass "-i with a seed repeats the conversation" || fail "-i replay differs"
# through a pty (script(1)): the same two turns, typed
if command -v script >/dev/null; then
	printf 'Hi there\nTell me more\n' | script -qfec "$R -i -n 6 --seed 4" /dev/null >"$S/pty.out" 2>&1
	n=$(grep -c 'salafw run: prefill' "$S/pty.out")
	[ "$n" = 2 ] && grep -q '> ' "$S/pty.out" && pass "-i through a pty: two replies" ||
		fail "-i through a pty: $(head -c 400 "$S/pty.out")"
else
	fail "script(1) missing (util-linux)"
fi
check_err "-i and --ids conflict" 2 "give exactly one of" $R -i --ids "$S/prompt.txt"

# ---- the chat template, --raw, --special, -m, --temperature, defaults ------
# -p with a chat model: the template's prompt. Its token count is what --raw
# prefills for the same text rendered by python3-jinja2 from the model's
# tokenizer_config.json (BOS added by both: the template writes none).
python3 - "$M/tokenizer_config.json" "$S/rendered.txt" <<'PY'
import json, sys
import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment
cfg = json.load(open(sys.argv[1]))
env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
t = env.from_string(cfg["chat_template"])
open(sys.argv[2], "w").write(t.render(messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello world"}],
                                      add_generation_prompt=True, bos_token="<s>", eos_token="<|im_end|>"))
PY
$R -p "Hello world" --system "Be brief." -n 1 --seed 1 2>"$S/chat.err" >/dev/null
$R --raw -f "$S/rendered.txt" -n 1 --seed 1 2>"$S/raw.err" >/dev/null
pc=$(sed -nE 's/.*prefill ([0-9]+) tokens.*/\1/p' "$S/chat.err")
pr=$(sed -nE 's/.*prefill ([0-9]+) tokens.*/\1/p' "$S/raw.err")
[ -n "$pc" ] && [ "$pc" = "$pr" ] && pass "-p --system prefills the template's rendering ($pc tokens, as jinja2 renders it)" ||
	fail "-p chat prefill $pc vs the jinja2 rendering $pr"
a1=$($R -p "Hello world" --system "Be brief." -n 8 --seed 2 --ignore-eos 2>/dev/null)
a2=$($R --raw -f "$S/rendered.txt" -n 8 --seed 2 --ignore-eos 2>/dev/null)
[ -n "$a1" ] && [ "$a1" = "$a2" ] && pass "... and replies as --raw does to that text" || fail "chat '$a1' vs raw '$a2'"
$R --raw -p "Hello world" -n 1 --seed 1 2>"$S/raw2.err" >/dev/null
p_raw=$(sed -nE 's/.*prefill ([0-9]+) tokens.*/\1/p' "$S/raw2.err")
[ -n "$p_raw" ] && [ "$p_raw" -lt "$pc" ] && pass "--raw -p is plain text ($p_raw tokens, not the template's)" ||
	fail "--raw prefill '$p_raw' vs chat $pc"
check_err "--raw with -i is a usage error" 2 "^salafw run: --raw is for -p and -f" $R --raw -i
check_err "--system with --raw is a usage error" 2 "^salafw run: --system needs a chat prompt" $R --raw -p x --system s
check_err "--chat-template-kwargs must be a JSON object" 2 "^salafw run: --chat-template-kwargs wants a JSON object" \
	$R -p x --chat-template-kwargs '[1]'
check "--chat-template-kwargs '{\"enable_thinking\": false}'" $R -p x -n 2 --chat-template-kwargs '{"enable_thinking": false}'
# -m DIR and --temperature, as llama.cpp users type them
x1=$($SALAFW run -m "$M" --no-verify -p "Hello world" -n 12 --temperature 0.7 --seed 5 2>/dev/null)
x2=$($R -p "Hello world" -n 12 --temp 0.7 --seed 5 2>/dev/null)
[ -n "$x1" ] && [ "$x1" = "$x2" ] && pass "-m DIR --temperature 0.7 is MODEL_DIR --temp 0.7" || fail "-m/--temperature: '$x1' vs '$x2'"
check_err "-m and MODEL_DIR together" 2 "expected one MODEL_DIR" $SALAFW run "$M" -m "$M" --no-verify -p x
x3=$($R -p "-m" -n 4 --seed 5 2>/dev/null)
[ -n "$x3" ] && pass "-p -m: '-m' as a prompt is not the model option" || fail "-p -m"
# special tokens: find a seed whose raw reply makes one (ids >= vocab - 8); shown only with --special
V=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["vocab_size"])' "$M/config.json")
found=
for sd in $(seq 1 60); do
	ids=$($R --raw -p "Hello" -n 48 --ignore-eos --seed "$sd" --print-ids 2>/dev/null)
	for i in $ids; do [ "$i" -ge $((V - 8)) ] && found=$sd && break; done
	[ -n "$found" ] && break
done
if [ -n "$found" ]; then
	hid=$($R --raw -p "Hello" -n 48 --ignore-eos --seed "$found" 2>/dev/null)
	shw=$($R --raw -p "Hello" -n 48 --ignore-eos --seed "$found" --special 2>/dev/null)
	if printf '%s' "$shw" | grep -qE '<\|(im_end|im_start|tool_call|execute_start|execute_end|fim_prefix|fim_middle|fim_suffix)\|>' &&
		! printf '%s' "$hid" | grep -qE '<\|[a-z_]+\|>'; then
		pass "special tokens are hidden by default and shown with --special (seed $found)"
	else fail "--special (seed $found): hidden '$hid' shown '$shw'"; fi
else
	fail "no seed in 1..60 made a special token"
fi
# generation_config.json's temperature is the default: 0 makes the run greedy
cp -r "$M" "$S/gc"
g0=$($R -p "Hello world" -n 16 --greedy --ignore-eos 2>/dev/null)
printf '{"temperature": 0.0, "top_p": 0.5}\n' > "$S/gc/generation_config.json"
g1=$($SALAFW run "$S/gc" --no-verify -p "Hello world" -n 16 --ignore-eos --seed 77 2>/dev/null)
g2=$($SALAFW run "$S/gc" --no-verify -p "Hello world" -n 16 --ignore-eos --seed 77 --temp 1 --top-p 1 2>/dev/null)
[ -n "$g1" ] && [ "$g1" = "$g0" ] && [ "$g2" != "$g0" ] &&
	pass "generation_config.json temperature 0 is the default (greedy); --temp overrides it" ||
	fail "generation_config defaults: '$g1' / '$g2' vs greedy '$g0'"
printf '{"temperature": "hot"}\n' > "$S/gc/generation_config.json"
check_err "a bad generation_config.json is named" 5 "generation_config.json.*temperature" \
	$SALAFW run "$S/gc" --no-verify -p x -n 1
check_report test_generate.sh
