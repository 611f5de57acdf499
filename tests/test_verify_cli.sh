#!/usr/bin/env bash
# test_verify_cli - salafw keygen/manifest/sign/verify from the command line,
# interop with the real minisign CLI in both directions, sha256sum as the
# independent hasher, and every bad input of issue #2 with its one-line error
# and exit code.
set -u
. tests/lib.sh
W=$(scratch)
export SALAFW_STATE_DIR=$W/state
REV=0123456789abcdef0123456789abcdef01234567
S=$SALAFW
command -v minisign >/dev/null || { fail "minisign CLI not installed (scripts/setup.sh)"; check_report test_verify_cli; exit 1; }

# A small model tree.
M=$W/model
mkdir -p "$M/sub"
head -c 300000 /dev/urandom >"$M/model.safetensors"
printf '{"hidden_size": 8}\n' >"$M/config.json"
printf 'tokenizer\n' >"$M/sub/tok.txt"

# --- keys: minisign -G -W and salafw keygen
minisign -G -W -p "$W/ms.pub" -s "$W/ms.key" -f >/dev/null 2>&1
check "minisign -G -W makes a key" test -s "$W/ms.key"
check "salafw keygen" $S keygen --pubkey-out "$W/sf.pub" -s "$W/sf.key"
check_err "keygen refuses to overwrite" 5 "already exists" $S keygen --pubkey-out "$W/sf.pub" -s "$W/sf.key"
check "secret key is mode 600" test "$(stat -c %a "$W/sf.key")" = 600
# The key id from the key itself: minisign's comment prints it without zero
# padding (%PRIX64), so a leading zero nibble (1 key in 16) would shorten it.
MSID=$(python3 -c 'import base64,sys; print(base64.b64decode(open(sys.argv[1]).read().split()[-1])[2:10][::-1].hex().upper())' "$W/ms.pub")

# --- manifest: digests agree with sha256sum, sorted, .salafw skipped
mkdir -p "$M/.salafw" && echo junk >"$M/.salafw/ignored"
check "salafw manifest" $S manifest "$M" --repo org/tiny --revision $REV --source http:http://127.0.0.1:1/files \
	--source hf:https://hf.example/ -o "$W/m.json"
rm -rf "$M/.salafw"
python3 - "$W/m.json" "$M" >"$W/py.out" 2>&1 <<'PY'
import json, sys, hashlib, os
m = json.load(open(sys.argv[1]))
paths = [f["path"] for f in m["files"]]
assert paths == sorted(paths, key=lambda p: p.encode()), paths
assert paths == ["config.json", "model.safetensors", "sub/tok.txt"], paths
for f in m["files"]:
    assert f["size"] == os.path.getsize(os.path.join(sys.argv[2], f["path"]))
assert m["total_size"] == sum(f["size"] for f in m["files"])
assert m["sources"] == [{"kind": "http", "base_url": "http://127.0.0.1:1/files/"}, {"kind": "hf", "endpoint": "https://hf.example"}], m["sources"]
assert m["publisher"]["key_id"] == ""
print("ok")
PY
check "manifest shape (python json)" grep -qx ok "$W/py.out"
(cd "$M" && sha256sum config.json model.safetensors sub/tok.txt) | while read -r h p; do
	grep -q "\"path\": \"$p\", \"size\": [0-9]*, \"sha256\": \"$h\"" "$W/m.json" || echo "BAD $p"
done >"$W/sha.out"
check "manifest sha256 equal sha256sum's" test ! -s "$W/sha.out"
mkdir -p "$M/.git" "$M/.cache/huggingface/download" "$M/sub/.git"
echo ref >"$M/.git/HEAD" && echo lock >"$M/.cache/huggingface/download/x.lock" && echo x >"$M/sub/.git/config"
check "manifest of a git/HF-cache checkout" $S manifest "$M" --repo org/tiny --revision $REV -o "$W/m-git.json"
check "... lists no .git or .cache/huggingface file" test "$(grep -c '"path"' "$W/m-git.json")" = 3
rm -rf "$M/.git" "$M/.cache" "$M/sub/.git"
check_err "manifest without --repo" 2 "--repo and --revision" $S manifest "$M" --revision $REV
check_err "manifest of a missing DIR" 5 "cannot open directory" $S manifest "$W/nope" --repo org/tiny --revision $REV
check_err "manifest with a bad revision" 3 "revision" $S manifest "$M" --repo org/tiny --revision main

# --- salafw sign -> minisign -V (both with salafw's key and a minisign -W key)
cp "$W/m.json" "$W/ms-signed.json"
cp "$W/m.json" "$W/sf-signed.json"
check "salafw sign" $S sign -s "$W/sf.key" "$W/sf-signed.json"
check "salafw sign fills publisher.key_id" grep -q "\"key_id\": \"$(sed -n 's/.*key \([0-9A-F]*\)$/\1/p' "$W/sf.pub")\"" "$W/sf-signed.json"
check "minisign -Vm verifies salafw's signature" minisign -Vm "$W/sf-signed.json" -p "$W/sf.pub"
check "minisign -Vm -H: salafw signs prehashed" minisign -Vm "$W/sf-signed.json" -p "$W/sf.pub" -H
check "trusted comment binds the manifest" grep -qx "trusted comment: salafw-manifest repo_id=org/tiny revision=$REV manifest_version=1" "$W/sf-signed.json.minisig"
cp "$W/m.json" "$W/ms2.json"
check "salafw sign with a minisign -W key" $S sign -s "$W/ms.key" "$W/ms2.json"
check "minisign verifies it" minisign -Vm "$W/ms2.json" -p "$W/ms.pub"
check_err "sign refuses another key's manifest" 3 "names publisher key" $S sign -s "$W/sf.key" "$W/ms2.json"
sed 's/"schema_version": 1/"schema_version": 7/' "$W/m.json" >"$W/badv.json" && cp "$W/badv.json" "$W/badv.orig"
check_err "sign refuses a manifest that does not parse" 3 "schema_version" $S sign -s "$W/sf.key" "$W/badv.json"
check "... and leaves it as it was, unsigned" sh -c "cmp -s '$W/badv.json' '$W/badv.orig' && test ! -e '$W/badv.json.minisig'"
check "sign --raw any file" $S sign -s "$W/sf.key" --raw "$M/config.json"
check "minisign verifies the raw signature" minisign -Vm "$M/config.json" -p "$W/sf.pub"
rm -f "$M/config.json.minisig"

# --- minisign -S -> salafw verify
sed -i "s/\"key_id\": \"\"/\"key_id\": \"$MSID\"/" "$W/ms-signed.json"
minisign -S -s "$W/ms.key" -m "$W/ms-signed.json" -t "salafw-manifest repo_id=org/tiny revision=$REV manifest_version=1" >/dev/null 2>&1
check "salafw verifies a minisign-signed manifest" $S verify "$M" --manifest "$W/ms-signed.json" --pubkey "$W/ms.pub"
check "... with -P KEY" $S verify "$M" --manifest "$W/ms-signed.json" -P "$(tail -n 1 "$W/ms.pub")" --no-state
cp "$W/ms-signed.json" "$W/legacy.json"
minisign -S -l -s "$W/ms.key" -m "$W/legacy.json" >/dev/null 2>&1
check "legacy (minisign -l) signature accepted" $S verify "$M" --manifest "$W/legacy.json" --pubkey "$W/ms.pub" --no-state
check_err "legacy refused with --require-prehashed" 3 "legacy" $S verify "$M" --manifest "$W/legacy.json" --pubkey "$W/ms.pub" --require-prehashed
cp "$W/ms-signed.json" "$W/crlf.json"
sed 's/$/\r/' "$W/ms-signed.json.minisig" >"$W/crlf.json.minisig"
check "CRLF signature file accepted" $S verify "$M" --manifest "$W/crlf.json" --pubkey "$W/ms.pub" --no-state
check_err "default key is the pinned service key" 3 "2DC28CC7B26A283B" $S verify "$M" --manifest "$W/ms-signed.json"
check_err "wrong trusted key: key id mismatch" 3 "was made by key $MSID" $S verify "$M" --manifest "$W/ms-signed.json" --pubkey "$W/sf.pub"

# --- the committed fixture signed by minisign 0.11 (tests/data/verify)
FX=tests/data/verify
check "committed minisign fixture verifies with salafw" $S verify $FX/model --manifest $FX/manifest.json --pubkey $FX/minisign.pub --no-state --repo salafw/fixture --revision 1111111111111111111111111111111111111111
check "... and with minisign" minisign -Vm $FX/manifest.json -p $FX/minisign.pub
check "fixture tree left untouched" test ! -e $FX/model/.salafw

# --- verify with the manifest kept in DIR/.salafw (as get writes it) and the JSON report
mkdir -p "$M/.salafw"
cp "$W/sf-signed.json" "$M/.salafw/manifest.json"
cp "$W/sf-signed.json.minisig" "$M/.salafw/manifest.json.minisig"
check "default manifest location" $S verify "$M" --pubkey "$W/sf.pub"
check "state.json recorded" test -s "$M/.salafw/state.json"
$S verify "$M" --pubkey "$W/sf.pub" >"$W/out.txt" 2>&1
check "report lists each file ok" test "$(grep -c '^ok ' "$W/out.txt")" = 3
$S verify "$M" --pubkey "$W/sf.pub" --json --threads 1 >"$W/r.json" 2>/dev/null
python3 -c '
import json,sys; r=json.load(open(sys.argv[1]))
assert r["ok"] is True and r["exit_code"] == 0 and r["repo_id"] == "org/tiny"
assert [f["status"] for f in r["files"]] == ["ok"]*3 and r["extra"] == [] and r["signature"]["prehashed"] is True
print("ok")' "$W/r.json" >"$W/py.out" 2>&1
check "--json report" grep -qx ok "$W/py.out"

# --- flipped bytes: salafw and minisign both reject
flip() { # file offset
	python3 -c 'import sys; p=sys.argv[1]; o=int(sys.argv[2]); b=bytearray(open(p,"rb").read()); b[o]^=1; open(p,"wb").write(b)' "$1" "$2"
}
for what in manifest sigline comment globalsig; do
	cp "$W/sf-signed.json" "$W/f.json"; cp "$W/sf-signed.json.minisig" "$W/f.json.minisig"
	case $what in
	manifest) flip "$W/f.json" 40 ;;
	sigline) flip "$W/f.json.minisig" $(( $(head -n 1 "$W/f.json.minisig" | wc -c) + 30 )) ;;
	comment) flip "$W/f.json.minisig" $(( $(head -n 2 "$W/f.json.minisig" | wc -c) + 40 )) ;;
	globalsig) flip "$W/f.json.minisig" $(( $(head -n 3 "$W/f.json.minisig" | wc -c) + 10 )) ;;
	esac
	check_err "flipped byte in $what: salafw rejects" 3 "^salafw: .*f\.json" $S verify "$M" --manifest "$W/f.json" --pubkey "$W/sf.pub"
	if minisign -Vm "$W/f.json" -p "$W/sf.pub" >/dev/null 2>&1; then fail "flipped byte in $what: minisign accepts it"
	else pass "flipped byte in $what: minisign rejects it too"; fi
done
K=$(tail -n 1 "$W/sf.pub")
for off in 5 20 40; do
	KF=$(python3 -c 'import sys; k=sys.argv[1]; o=int(sys.argv[2]); c="A" if k[o]!="A" else "B"; print(k[:o]+c+k[o+1:])' "$K" $off)
	check_err "flipped key character $off rejected" 3 "^salafw: " $S verify "$M" --pubkey-string "$KF"
done

# --- bad signature files
bad_sig() { # descr pattern; reads the signature text from stdin
	local d=$1 pat=$2
	cp "$W/sf-signed.json" "$W/b.json"
	cat >"$W/b.json.minisig"
	check_err "$d" 3 "$pat" $S verify "$M" --manifest "$W/b.json" --pubkey "$W/sf.pub"
}
SIG=$W/sf-signed.json.minisig
head -n 3 "$SIG" | bad_sig "3-line signature" "3 lines"
{ cat "$SIG"; echo extra; } | bad_sig "5-line signature" "more than 4 lines"
{ head -n 1 "$SIG"; sed -n 2p "$SIG" | cut -c1-96; tail -n 2 "$SIG"; } | bad_sig "bad base64 (truncated)" "line 2 is not the base64"
{ head -n 1 "$SIG"; sed -n 2p "$SIG" | sed 's/^\(.\{10\}\)./\1!/'; tail -n 2 "$SIG"; } | bad_sig "bad base64 (character)" "line 2 is not the base64"
{ echo "no prefix"; tail -n 3 "$SIG"; } | bad_sig "untrusted comment without prefix" "line 1 should start"
{ head -n 2 "$SIG"; printf 'trusted comment: a\001b\n'; tail -n 1 "$SIG"; } | bad_sig "control character in trusted comment" "unprintable"
python3 - "$SIG" "$W/ms.pub" <<'PY' | bad_sig "wrong key id in the signature" "was made by key"
import base64, sys
lines = open(sys.argv[1]).read().split("\n")
raw = bytearray(base64.b64decode(lines[1])); raw[2] ^= 0xff
lines[1] = base64.b64encode(bytes(raw)).decode(); print("\n".join(lines), end="")
PY
python3 - "$SIG" <<'PY' | bad_sig "wrong algorithm bytes" "unsupported signature algorithm"
import base64, sys
lines = open(sys.argv[1]).read().split("\n")
raw = bytearray(base64.b64decode(lines[1])); raw[0:2] = b"Xx"
lines[1] = base64.b64encode(bytes(raw)).decode(); print("\n".join(lines), end="")
PY
cp "$W/sf-signed.json" "$W/nosig.json"
check_err "missing .minisig" 3 "nosig.json.minisig" $S verify "$M" --manifest "$W/nosig.json" --pubkey "$W/sf.pub"

# --- bad manifests, validly signed (signature passes, the content is refused)
signed_bad() { # descr pattern ; manifest text on stdin
	local d=$1 pat=$2
	cat >"$W/x.json"
	$S sign -s "$W/sf.key" --raw "$W/x.json" >/dev/null 2>&1
	check_err "$d" 3 "$pat" $S verify "$M" --manifest "$W/x.json" --pubkey "$W/sf.pub"
}
sed 's/"sub\/tok.txt"/"..\/tok.txt"/' "$W/sf-signed.json" | signed_bad "path ../x" "not normalised"
sed 's/"sub\/tok.txt"/"\/etc\/tok.txt"/' "$W/sf-signed.json" | signed_bad "path /etc/x" "absolute"
sed 's/"sub\/tok.txt"/"sub\/.\/tok.txt"/' "$W/sf-signed.json" | signed_bad "path a/./b" "not normalised"
sed 's/"sub\/tok.txt"/"sub\\\\tok.txt"/' "$W/sf-signed.json" | signed_bad "path a\\b" "backslash"
head -c 200 "$W/sf-signed.json" | signed_bad "truncated manifest" "invalid JSON"
sed 's/"repo_type": "model"/"repo_type": "model", "repo_id": "x\/y"/' "$W/sf-signed.json" | signed_bad "duplicate key" "duplicate key"
sed 's/"generator": "salafw/"generator": "\xff/' "$W/sf-signed.json" | signed_bad "non-UTF-8 manifest" "UTF-8"
sed 's/"size": 300000/"size": "300000"/' "$W/sf-signed.json" | signed_bad "size as a string" "size"
sed 's/"size": 300000/"size": -300000/' "$W/sf-signed.json" | signed_bad "negative size" "size"
sed 's/"size": 300000/"size": 9007199254740993/' "$W/sf-signed.json" | signed_bad "size over 2^53" "2\^53"
python3 -c 'import sys; t=open(sys.argv[1]).read(); print(t[:-3] + " " * (1<<20) + "}")' "$W/sf-signed.json" >"$W/big.json"
cp "$W/sf-signed.json.minisig" "$W/big.json.minisig"
check_err "oversized manifest" 3 "too large" $S verify "$M" --manifest "$W/big.json" --pubkey "$W/sf.pub"
python3 - "$W/sf-signed.json" <<'PY' | signed_bad "unsorted paths" "not sorted"
import json, sys
t = open(sys.argv[1]).read(); m = json.loads(t); m["files"].reverse(); print(json.dumps(m))
PY
python3 - "$W/sf-signed.json" <<'PY' | signed_bad "duplicate paths" "duplicate path"
import json, sys
m = json.load(open(sys.argv[1])); m["files"].insert(1, m["files"][0]); m["total_size"] += m["files"][0]["size"]; print(json.dumps(m))
PY
check_err "binding: --repo" 3 "not the requested 'org/other'" $S verify "$M" --manifest "$W/sf-signed.json" --pubkey "$W/sf.pub" --repo org/other

# --- expiry warns on offline verify; rollback is refused
$S manifest "$M" --repo org/tiny --revision $REV --expires-days 1 --pubkey "$W/sf.pub" -o "$W/old.json" >/dev/null 2>&1
python3 -c 'import sys; p=sys.argv[1]; t=open(p).read(); import re; t=re.sub(r"\"created\": \"[^\"]*\"", "\"created\": \"2020-01-01T00:00:00Z\"", t); t=re.sub(r"\"expires\": \"[^\"]*\"", "\"expires\": \"2020-01-02T00:00:00Z\"", t); open(p,"w").write(t)' "$W/old.json"
$S sign -s "$W/sf.key" "$W/old.json" >/dev/null 2>&1
check_err "expired manifest: warning, exit 0" 0 "expired at 2020-01-02T00:00:00Z" env SALAFW_STATE_DIR="$W/state-exp" $S verify "$M" --manifest "$W/old.json" --pubkey "$W/sf.pub" --no-state
$S manifest "$M" --repo org/tiny --revision $REV --manifest-version 5 --pubkey "$W/sf.pub" -o "$W/v5.json" >/dev/null 2>&1
$S sign -s "$W/sf.key" "$W/v5.json" >/dev/null 2>&1
check "manifest_version 5 verifies" $S verify "$M" --manifest "$W/v5.json" --pubkey "$W/sf.pub" --no-state
check_err "older manifest_version refused (rollback)" 3 "rollback" $S verify "$M" --manifest "$W/sf-signed.json" --pubkey "$W/sf.pub"
check "--allow-downgrade" $S verify "$M" --manifest "$W/sf-signed.json" --pubkey "$W/sf.pub" --allow-downgrade --no-state
SFID=$(sed -n 's/.*public key \([0-9A-F]*\)$/\1/p' "$W/sf.pub")
RAT=$(ls "$SALAFW_STATE_DIR"/trusted/*."$SFID".json)
echo '{broken' >"$RAT"
check_err "a damaged rollback state is an error with a way out" 5 "allow-downgrade starts it afresh" $S verify "$M" --manifest "$W/v5.json" --pubkey "$W/sf.pub" --no-state
check_err "... which --allow-downgrade takes (and rewrites it)" 0 "damaged" $S verify "$M" --manifest "$W/v5.json" --pubkey "$W/sf.pub" --allow-downgrade --no-state
check "... so the next intake is checked again" python3 -c 'import json,sys; assert json.load(open(sys.argv[1]))["manifest_version"] == 5' "$RAT"
rm -rf "$SALAFW_STATE_DIR"

# --- the tree: missing, size, hash, symlinks, extra
V() { $S verify "$M" --pubkey "$W/sf.pub" "$@"; }
printf 'TOKENIZER\n' >"$M/sub/tok.txt"
check_err "sha256 mismatch" 1 "sub/tok.txt': sha256 mismatch" V
V >"$W/r.txt" 2>/dev/null
check "... the file's line says the same words" grep -q "^sha256 mismatch  *sub/tok.txt$" "$W/r.txt"
$S verify "$M" --pubkey "$W/sf.pub" --json >"$W/r.json" 2>/dev/null
check "--json says sha256 mismatch" python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); assert r["ok"] is False and r["exit_code"]==1 and r["files"][2]["status"]=="sha256 mismatch"' "$W/r.json"
printf 'tok\n' >"$M/sub/tok.txt"
check_err "size mismatch" 1 "size mismatch" V
rm "$M/sub/tok.txt"
check_err "missing file" 1 "sub/tok.txt': missing" V
printf 'tokenizer\n' >"$M/sub/tok.txt"
echo x >"$M/stray.bin"
check_err "extra file is a warning" 0 "warning: extra file not in the manifest: stray.bin" V
mkdir -p "$M/.git" "$M/.cache/huggingface" && echo ref >"$M/.git/HEAD" && echo x >"$M/.cache/huggingface/y"
V >"$W/extra.out" 2>&1
check "... but .git and .cache/huggingface are not extra files" test "$(grep -c 'extra file' "$W/extra.out")" = 1
rm -rf "$M/stray.bin" "$M/.git" "$M/.cache"
mkdir -p "$W/elsewhere/sub" && cp "$M/sub/tok.txt" "$W/elsewhere/sub/"
mv "$M/sub" "$W/sub.real" && ln -s "$W/elsewhere/sub" "$M/sub"
check_err "symlinked subdirectory refused" 3 "sub/tok.txt': not a regular file" V
rm "$M/sub" && mv "$W/sub.real" "$M/sub"
mv "$M/config.json" "$W/config.real" && ln -s "$W/config.real" "$M/config.json"
check_err "symlinked file refused" 3 "config.json': not a regular file" V
rm "$M/config.json" && mv "$W/config.real" "$M/config.json"
check "all good again" V
mv "$M/config.json" "$W/config.real" && mv "$M/sub/tok.txt" "$W/tok.real" && ln -s "$W/tok.real" "$M/sub/tok.txt"
check_err "the file named is one of the worst kind (exit 3: the symlink, not the missing file)" 3 "sub/tok.txt': not a regular file" V
rm "$M/sub/tok.txt" && mv "$W/tok.real" "$M/sub/tok.txt" && mv "$W/config.real" "$M/config.json"

# --- the verified-state record follows the last verify
V >/dev/null 2>&1
rec() { python3 -c 'import json,sys; print(" ".join(sorted(json.load(open(sys.argv[1]))["files"])))' "$M/.salafw/state.json"; }
check "state lists every file" test "$(rec)" = "config.json model.safetensors sub/tok.txt"
printf 'TOKENIZER\n' >"$M/sub/tok.txt"
check_err "a corrupted file fails verify" 1 "sha256 mismatch" V
check "... and loses its record (a stale record would let run use it)" test "$(rec)" = "config.json model.safetensors"
printf 'tokenizer\n' >"$M/sub/tok.txt"
check "verify again records it" sh -c "$S verify '$M' --pubkey '$W/sf.pub' >/dev/null 2>&1 && test \"\$(python3 -c 'import json,sys; print(len(json.load(open(sys.argv[1]))[\"files\"]))' '$M/.salafw/state.json')\" = 3"
# a failing verify --manifest leaves the folder's manifest and record as they were
cp "$M/.salafw/state.json" "$W/state.before" && cp "$M/.salafw/manifest.json" "$W/manifest.before"
printf 'TOKENIZER\n' >"$M/sub/tok.txt"
check_err "verify --manifest with a bad file" 1 "sha256 mismatch" $S verify "$M" --manifest "$W/v5.json" --pubkey "$W/sf.pub"
check "... keeps state.json" cmp -s "$W/state.before" "$M/.salafw/state.json"
check "... keeps the installed manifest" cmp -s "$W/manifest.before" "$M/.salafw/manifest.json"
check_err "verify --manifest (the folder's own) with a bad file" 1 "sha256 mismatch" $S verify "$M" --manifest "$W/sf-signed.json" --pubkey "$W/sf.pub"
check "... drops that file's record (same manifest)" test "$(rec)" = "config.json model.safetensors"
printf 'tokenizer\n' >"$M/sub/tok.txt"
check "verify --manifest v5 (all good) installs it" $S verify "$M" --manifest "$W/v5.json" --pubkey "$W/sf.pub"
check "... and records against it" python3 -c 'import json,sys,hashlib; s=json.load(open(sys.argv[1])); assert s["manifest_sha256"]==hashlib.sha256(open(sys.argv[2],"rb").read()).hexdigest() and len(s["files"])==3' "$M/.salafw/state.json" "$W/v5.json"
# rollback is about taking a manifest in: a folder keeping its own older
# version stays verifiable after a newer one was seen elsewhere
rm -rf "$W/m1" && cp -r "$M" "$W/m1" && cp "$W/sf-signed.json" "$W/m1/.salafw/manifest.json" && cp "$W/sf-signed.json.minisig" "$W/m1/.salafw/manifest.json.minisig"
check "offline verify of a folder's own version 1 after version 5" $S verify "$W/m1" --pubkey "$W/sf.pub"
check_err "... but taking version 1 in is a rollback" 3 "rollback" $S verify "$W/m1" --manifest "$W/sf-signed.json" --pubkey "$W/sf.pub"
cp "$W/sf-signed.json" "$M/.salafw/manifest.json" && cp "$W/sf-signed.json.minisig" "$M/.salafw/manifest.json.minisig"
rm -rf "$SALAFW_STATE_DIR" "$W/m1"
before=$(stat -c '%Y %Z %i' "$M/model.safetensors")
V >/dev/null 2>&1
check "verify never modifies a model file" test "$(stat -c '%Y %Z %i' "$M/model.safetensors")" = "$before"

# --- DIR problems and usage
check_err "missing DIR" 5 "cannot open directory '$W/nope'" $S verify "$W/nope"
check_err "DIR is a file" 5 "cannot open directory" $S verify "$M/config.json"
if [ "$(id -u)" != 0 ]; then
	mkdir -p "$W/locked" && chmod 000 "$W/locked"
	check_err "unreadable DIR" 5 "cannot open directory" $S verify "$W/locked"
	chmod 755 "$W/locked"
else
	mkdir -p "$W/locked/.salafw" && printf '{}' >"$W/locked/.salafw/manifest.json" && chmod 000 "$W/locked/.salafw/manifest.json"
	check_err "unreadable manifest (root: no DIR permission test)" 3 "manifest.json" $S verify "$W/locked"
fi
check_err "no manifest in DIR: not verified (exit 1, as run and quant)" 1 "has no signed manifest" $S verify "$W/elsewhere"
check_err "verify without DIR" 2 "expected one DIR" $S verify
check_err "unknown option" 2 "unknown option" $S verify "$M" --frobnicate
check_err "bad -P key" 3 "base64" $S verify "$M" -P notakey
check_err "sign without key" 2 "secret key is required" $S sign "$W/m.json"
check_err "sign with a missing key" 5 "cannot open" $S sign -s "$W/nokey" "$W/m.json"
check_err "sign a missing manifest: exit 5 (local input), not 1" 5 "nope.json" $S sign -s "$W/sf.key" "$W/nope.json"
check_err "sign --raw a missing file: exit 5" 5 "cannot open" $S sign -s "$W/sf.key" --raw "$W/nope.bin"
check_err "verify with a missing --pubkey file" 5 "cannot open" $S verify "$M" --pubkey "$W/nokey.pub"

check_report test_verify_cli
