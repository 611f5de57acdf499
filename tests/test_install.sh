#!/usr/bin/env bash
# test_install.sh - `make install PREFIX=...` puts the binary, the pinned keys
# and pins, and salafw.1 in place; the page renders with man -l and groff
# without warnings and holds a section per command with that command's
# options (the same tables as --help); the installed binary, run from
# elsewhere, finds its keys (--pubkey freeweights = the compiled-in key).
set -u
cd "$(dirname "$0")/.."
. tests/lib.sh
P=$(scratch)/prefix
make -s install BUILD="$BUILD" PREFIX="$P" >/dev/null 2>"$P.err" || { fail "make install: $(cat "$P.err")"; }
check "binary installed" test -x "$P/bin/salafw"
check "pinned key installed" cmp -s "$P/share/salafw/manifests/freeweights.pub" manifests/freeweights.pub
check "pins installed" test -f "$P/share/salafw/manifests/pins/openbmb__MiniCPM-SALA.pin"
check "man page installed" test -s "$P/share/man/man1/salafw.1"
check "no temporary file left" test -z "$(find "$P" -name '*.tmp*')"
W=$(groff -man -Tutf8 -ww -z "$P/share/man/man1/salafw.1" 2>&1)
[ -z "$W" ] && pass "groff renders it without warnings" || fail "groff warnings: $(echo "$W" | head -5)"
txt=$(MANWIDTH=100 man -l "$P/share/man/man1/salafw.1" 2>/dev/null | col -b)
for c in get verify manifest sign keygen mkmodel quant run score bench; do
	echo "$txt" | grep -q "^SALAFW $(echo $c | tr a-z A-Z)" || fail "man -l: no section for $c"
done
echo "$txt" | grep -q -- "-P, --pubkey KEY|FILE" && pass "man -l shows the options" || fail "man -l options"
echo "$txt" | grep -q "^EXIT STATUS" && echo "$txt" | grep -q "130, 143" && pass "man -l shows the exit codes" || fail "man exit status"
cmp -s <("$P/bin/salafw" --man) "$P/share/man/man1/salafw.1" && pass "the page is salafw --man" || fail "page differs from --man"
cd /
out=$("$P/bin/salafw" --version)
echo "$out" | grep -qF "pinned keys: $P/share/salafw/manifests" && pass "the installed binary finds its keys folder" || fail "keys: $out"
# a directory signed by another key: with --pubkey freeweights the refusal names
# the installed key's id (the compiled-in one), so the name was resolved
T=$(scratch)
mkdir -p "$T/m/.salafw" && echo x > "$T/m/f.txt"
"$P/bin/salafw" keygen --pubkey-out "$T/o.pub" -s "$T/o.key" >/dev/null
"$P/bin/salafw" manifest "$T/m" --repo a/b --revision 0123456789abcdef0123456789abcdef01234567 -P "$T/o.pub" -o "$T/m/.salafw/manifest.json"
"$P/bin/salafw" sign -s "$T/o.key" "$T/m/.salafw/manifest.json" >/dev/null
check_err "--pubkey freeweights: the installed key, by name" 3 "2DC28CC7B26A283B" \
	env SALAFW_STATE_DIR="$T/st" "$P/bin/salafw" verify "$T/m" --pubkey freeweights
check_err "--pubkey of a name not installed: cannot open / not base64" 3 "base64" \
	env SALAFW_STATE_DIR="$T/st" "$P/bin/salafw" verify "$T/m" --pubkey nosuchkey
cp "$T/o.pub" "$P/share/salafw/manifests/local.pub"
check "a key put in PREFIX/share/salafw/manifests is found by name, from /" \
	env SALAFW_STATE_DIR="$T/st" "$P/bin/salafw" verify "$T/m" --pubkey local
check "the installed binary verifies with a key file" env SALAFW_STATE_DIR="$T/st" "$P/bin/salafw" verify "$T/m" -P "$T/o.pub"
cd - >/dev/null
check_report test_install
