#!/usr/bin/env bash
# test_get_faults.sh - `salafw get` against hostile sources, manifests and
# DEST contents (issue 27, items 11-15), with tests/httpd/faultd.py servers
# this test starts and stops itself and manifests signed by the real
# minisign CLI:
#   11. a password or token in a source URL (manifest source, --mirror,
#       --manifest, --endpoint) is never printed: not on progress lines, not in
#       --json, not in errors; the server still gets it (Basic auth, read from
#       faultd's log, checked with base64 here);
#   12. a response header over libcurl's 100 KB limit fails that source (the
#       next one serves the file); from --endpoint it is exit 4;
#   13. a symlink (or a folder) planted at .salafw/partial/X.part is an
#       unsafe path (exit 3) with a hint, its target untouched;
#   14. names with a bidi override or a zero-width character are shown
#       escaped (stderr and --json); names equal up to NFC/NFD or Unicode case
#       are refused together (exit 3, nothing written);
#   15. dead sources (refused connections) are struck once for every file,
#       and a file is tried on at most 64 sources.
set -u
cd "$(dirname "$0")/.."
. tests/lib.sh
T=$(scratch)
FAULTD="python3 tests/httpd/faultd.py"
REPO=test/faults
REV=89abcdef0123456789abcdef0123456789abcdef
G() { SALAFW_STATE_DIR=$(mktemp -d "$T/state.XXXXXX") timeout 60 "$SALAFW" get "$@"; }

mkdir -p "$T/model" "$T/man/manifests/test"
head -c 300000 /dev/urandom >"$T/model/a.bin"
head -c 100000 /dev/urandom >"$T/model/b.bin"
echo 'c' >"$T/model/c.txt"
minisign -G -W -p "$T/k.pub" -s "$T/k.key" -f >/dev/null 2>&1 || { echo "FAIL minisign -G"; exit 1; }
KEYID=$(python3 -c '
import base64,sys
b=base64.b64decode(open(sys.argv[1]).read().splitlines()[1])
print("%016X" % int.from_bytes(b[2:10],"little"))' "$T/k.pub")
# mkman OUT DIR [faultd manifest args...]: OUT listing DIR's files, signed
mkman() {
	local out=$1 dir=$2; shift 2
	$FAULTD manifest --dir "$dir" --repo "$REPO" --rev "$REV" --key-id "$KEYID" "$@" >"$out" || return 1
	rm -f "$out.minisig"
	minisign -S -s "$T/k.key" -m "$out" -x "$out.minisig" \
		-t "salafw-manifest repo_id=$REPO revision=$REV manifest_version=1" >/dev/null 2>&1
}
faultd() { faultd_serve "$T/model" 120 "$@"; }
events() { grep -c "\"event\":\"$2\"" "$1" 2>/dev/null || true; }
summary() { json_summary "$@"; }
# same_tree DEST: every model file in DEST, equal to the original
same_tree() { for f in a.bin b.bin c.txt; do cmp -s "$T/model/$f" "$1/$f" || return 1; done; }

faultd good
GOOD=http://127.0.0.1:$PORT_good
faultd e404 --fault 404
# a port nothing listens on: connections to it are refused
DEAD=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')

# ---- 11. userinfo never printed -----------------------------------------------------
PW=s3cretPW11
mkman "$T/m11.json" "$T/model" --unnamed --source "http:http://muser:$PW@127.0.0.1:$PORT_good/"
# a failing --mirror with a token as its user, tried first; the manifest's
# source (no name: shown by its URL) serves everything
G "$REPO" --manifest "$T/m11.json" -P "$T/k.pub" -d "$T/d11" --json --progress-interval 0.1 \
	--mirror "http:http://tok11$PW@127.0.0.1:$PORT_e404/" >"$T/o11" 2>"$T/e11"
rc=$?
check "11: get with passwords in source URLs succeeds (exit $rc)" test "$rc" = 0
check "11: every file verified" same_tree "$T/d11"
check "11: the password is in no --json line nor on stderr" test "$(cat "$T/o11" "$T/e11" | grep -c "$PW")" = 0
check "11: the manifest source is shown redacted in --json (http://***@host)" \
	grep -q "\"source\":\"http://\*\*\*@127.0.0.1:$PORT_good/\"" "$T/o11"
check "11: the failing mirror is shown redacted in --json" \
	grep -q "\"source\":\"http://\*\*\*@127.0.0.1:$PORT_e404/\"" "$T/o11"
B64=$(printf 'muser:%s' "$PW" | base64)
check "11: the server still got the credentials (Basic auth)" grep -q "\"auth\": \"Basic $B64\"" "$T/good.log"
# plain mode: the start lines and the progress lines name the source
G "$REPO" --manifest "$T/m11.json" -P "$T/k.pub" -d "$T/d11b" --progress-interval 0.1 \
	--mirror "http:http://tok11$PW@127.0.0.1:$PORT_e404/" >"$T/o11b" 2>"$T/e11b"
rc=$?
check "11: plain mode: exit 0 (exit $rc)" test "$rc" = 0
check "11: plain mode: start lines name the source redacted" grep -q "via http://\*\*\*@127.0.0.1:$PORT_e404/" "$T/e11b"
check "11: plain mode: a failed source is named redacted" grep -q "source   http://\*\*\*@127.0.0.1:$PORT_e404/ failed" "$T/e11b"
check "11: plain mode: the password is not printed" test "$(grep -c "$PW" "$T/e11b" "$T/o11b" | awk -F: '{s+=$2} END {print s}')" = 0
# errors: a --manifest URL and an --endpoint with userinfo
check_err "11: --manifest URL with a password, not there: exit 4, shown redacted" 4 \
	"'http://\*\*\*@127.0.0.1:$PORT_good/none.json' is not there" \
	G "$REPO" --manifest "http://muser:$PW@127.0.0.1:$PORT_good/none.json" -P "$T/k.pub" -d "$T/d11c"
G test/absent --endpoint "http://muser:$PW@127.0.0.1:$PORT_good" -P "$T/k.pub" -d "$T/d11d" >"$T/o11d" 2>"$T/e11d"
rc=$?
check "11: --endpoint with a password, repository absent: exit 4 (exit $rc)" test "$rc" = 4
check "11: --endpoint error names it redacted" grep -q "is not on 'http://\*\*\*@127.0.0.1:$PORT_good'" "$T/e11d"
check "11: --endpoint error: the password is not printed" test "$(grep -c "$PW" "$T/e11d")" = 0
# a --mirror refused as a usage error: named, its password not
G "$REPO" --manifest "$T/m11.json" -P "$T/k.pub" -d "$T/d11f" --mirror "ftp:http://u:$PW@h/" >/dev/null 2>"$T/e11f"
rc=$?
check "11: a --mirror of another kind: usage error, exit 2 (exit $rc)" test "$rc" = 2
check "11: ... named with its password redacted" grep -q "mirror 'ftp:http://\*\*\*@h/': kind must be http or hf" "$T/e11f"
check "11: ... the password not printed" test "$(grep -c "$PW" "$T/e11f")" = 0
# the manifest verified from a URL with a password: the "manifest verified" line
cp "$T/m11.json" "$T/model/m11.json" && cp "$T/m11.json.minisig" "$T/model/m11.json.minisig"
G "$REPO" --manifest "http://muser:$PW@127.0.0.1:$PORT_good/m11.json" -P "$T/k.pub" -d "$T/d11e" --json \
	>"$T/o11e" 2>"$T/e11e"
rc=$?
check "11: a manifest fetched with a password: exit 0 (exit $rc)" test "$rc" = 0
check "11: its 'manifest' event names it redacted" grep -q '"event":"manifest".*http://\*\*\*@127' "$T/o11e"
check "11: ... and never with the password" test "$(cat "$T/o11e" "$T/e11e" | grep -c "$PW")" = 0
rm -f "$T/model/m11.json" "$T/model/m11.json.minisig"

# ---- 12. a header over libcurl's limit fails that source --------------------------
faultd big --fault bighead:200000
mkman "$T/m12.json" "$T/model" --source "http:http://127.0.0.1:$PORT_big/" --source "http:$GOOD/"
G "$REPO" --manifest "$T/m12.json" -P "$T/k.pub" -d "$T/d12" --json >"$T/o12" 2>"$T/e12"
rc=$?
check "12: a 200 KB header on the first source: the next one serves, exit 0 (exit $rc)" test "$rc" = 0
check "12: every file verified" same_tree "$T/d12"
check "12: the first source failed with 'response header too large'" \
	grep -q '"event":"source_failed".*"source":"src0".*response header too large' "$T/o12"
check "12: the big-header server was asked (it is the first source)" test -s "$T/big.log"
faultd_serve "$T/man" 120 bigm --fault bighead:200000
check_err "12: --endpoint answering with a 200 KB header: exit 4 (network)" 4 "response header too large" \
	G "$REPO" --endpoint "http://127.0.0.1:$PORT_bigm" -P "$T/k.pub" -d "$T/d12b"
check_err "12: --manifest URL answering with a 200 KB header: exit 4" 4 "response header too large" \
	G "$REPO" --manifest "http://127.0.0.1:$PORT_big/m.json" -P "$T/k.pub" -d "$T/d12c"

# ---- 13. a planted link or folder at a partial's name -------------------------------
mkman "$T/m13.json" "$T/model" --source "http:$GOOD/"
ptag() { python3 -c '
import sys
h=14695981039346656037
for b in sys.argv[1].encode(): h=((h^b)*1099511628211)%2**64
print("%016x"%h)' "$1"; }
PART="$(sha256sum "$T/model/a.bin" | cut -c1-64)-$(ptag a.bin).part"
mkdir -p "$T/d13/.salafw/partial"
echo "do not touch" >"$T/victim"
ln -s "$T/victim" "$T/d13/.salafw/partial/$PART"
check_err "13: a symlink at partial/X.part: exit 3, unsafe path" 3 "unsafe path: '.*$PART' is a symlink" \
	G "$REPO" --manifest "$T/m13.json" -P "$T/k.pub" -d "$T/d13"
check_err "13: ... with a hint (remove it and run again)" 3 "remove it and run again" \
	G "$REPO" --manifest "$T/m13.json" -P "$T/k.pub" -d "$T/d13"
check "13: the link's target is untouched" test "$(cat "$T/victim")" = "do not touch"
check "13: the link is still a link (not followed, not replaced)" test -L "$T/d13/.salafw/partial/$PART"
rm "$T/d13/.salafw/partial/$PART"
check_exit "13: the link removed, the same get succeeds" 0 G "$REPO" --manifest "$T/m13.json" -P "$T/k.pub" -d "$T/d13"
check "13: every file verified after the rerun" same_tree "$T/d13"
mkdir -p "$T/d13b/.salafw/partial/$PART"
check_err "13: a folder at partial/X.part: exit 3, unsafe path" 3 "unsafe path: '.*$PART' is a folder" \
	G "$REPO" --manifest "$T/m13.json" -P "$T/k.pub" -d "$T/d13b"
mkdir -p "$T/d13c/.salafw/partial"
mkfifo "$T/d13c/.salafw/partial/$PART"
check_err "13: a FIFO at partial/X.part: exit 3, not a regular file" 3 "unsafe path: '.*$PART' is not a regular file" \
	G "$REPO" --manifest "$T/m13.json" -P "$T/k.pub" -d "$T/d13c"

# ---- 14. names that hide text, names that are one name to a file system -------------
mkdir -p "$T/uni"
RLO=$(printf '\xe2\x80\xae') ZWSP=$(printf '\xe2\x80\x8b')
echo x >"$T/uni/evil${RLO}gnp.exe"
echo y >"$T/uni/a${ZWSP}b.txt"
faultd_serve "$T/uni" 120 uni
mkman "$T/m14.json" "$T/uni" --source "http:http://127.0.0.1:$PORT_uni/"
G "$REPO" --manifest "$T/m14.json" -P "$T/k.pub" -d "$T/d14" >"$T/o14" 2>"$T/e14"
rc=$?
check "14: names with U+202E and U+200B download (exit $rc)" test "$rc" = 0
check "14: stderr has no raw U+202E" test "$(grep -c "$RLO" "$T/e14")" = 0
check "14: stderr has no raw U+200B" test "$(grep -c "$ZWSP" "$T/e14")" = 0
check "14: U+202E shown escaped like a control character" grep -qF 'verified evil\xe2\x80\xaegnp.exe' "$T/e14"
check "14: U+200B shown escaped" grep -qF 'verified a\xe2\x80\x8bb.txt' "$T/e14"
G "$REPO" --manifest "$T/m14.json" -P "$T/k.pub" -d "$T/d14b" --json >"$T/o14b" 2>"$T/e14b"
check "14: --json has no raw U+202E or U+200B" test "$(cat "$T/o14b" | grep -c -e "$RLO" -e "$ZWSP")" = 0
check "14: --json escapes U+202E as \\u202e" grep -qF '"path":"evil\u202egnp.exe"' "$T/o14b"
check "14: --json names still parse to the real names" python3 -c '
import json,sys
names={json.loads(l).get("path") for l in open(sys.argv[1]) if l.startswith("{")}
sys.exit(0 if "evil\u202egnp.exe" in names and "a\u200bb.txt" in names else 1)' "$T/o14b"
# collisions: NFC/NFD, U+212B/U+00C5, non-ASCII case
collide() { # collide NAME1 NAME2 TAG: a manifest of the two; get must refuse it
	rm -rf "$T/c$3" && mkdir -p "$T/c$3" && echo 1 >"$T/c$3/$1" && echo 2 >"$T/c$3/$2"
	mkman "$T/m$3.json" "$T/c$3" --source "http:$GOOD/"
	check_err "14: '$1' and '$2' ($3) refused together: exit 3" 3 "differ only in case" \
		G "$REPO" --manifest "$T/m$3.json" -P "$T/k.pub" -d "$T/dc$3"
	check "14: $3: nothing written" test ! -e "$T/dc$3"
}
collide "caf$(printf '\xc3\xa9').txt" "cafe$(printf '\xcc\x81').txt" nfc-nfd
collide "$(printf '\xe2\x84\xab')" "$(printf '\xc3\x85')" angstrom
collide "$(printf '\xc3\x89').txt" "$(printf '\xc3\xa9').txt" latin-case
collide "Stra$(printf '\xc3\x9f')e" "STRASSE" sharp-s
collide "A.txt" "a.txt" ascii-case

# ---- 15. dead sources: struck once for every file, at most 64 per file -------------
args=()
for i in $(seq 60); do args+=(--source "http:http://127.0.0.1:$DEAD/d$i/"); done
mkman "$T/m15.json" "$T/model" "${args[@]}" --source "http:$GOOD/"
G "$REPO" --manifest "$T/m15.json" -P "$T/k.pub" -d "$T/d15" --json >"$T/o15" 2>"$T/e15"
rc=$?
check "15: 60 dead sources then a good one: exit 0 (exit $rc)" test "$rc" = 0
check "15: every file verified" same_tree "$T/d15"
n=$(events "$T/o15" source_failed)
check "15: each dead source failed once for all 3 files ($n events, want 60)" test "$n" = 60
check "15: ... as one event with no file" test "$(grep '"event":"source_failed"' "$T/o15" | grep -c '"path"')" = 0
check "15: ... that says so" grep -q 'not tried again for any file' "$T/o15"
args=()
for i in $(seq 2000); do args+=(--source "http:http://127.0.0.1:$DEAD/x$i/"); done
mkman "$T/m15b.json" "$T/model" "${args[@]}"
G "$REPO" --manifest "$T/m15b.json" -P "$T/k.pub" -d "$T/d15b" --json >"$T/o15b" 2>"$T/e15b"
rc=$?
check "15: 2000 dead sources: exit 4, every source failed (exit $rc)" test "$rc" = 4
n=$(events "$T/o15b" source_failed)
check "15: 2000 dead sources: 64 tried ($n source_failed events)" test "$n" = 64
check "15: the error names the limit and the sources left untried" \
	grep -q '64 sources failed, the most tried per file; 1936 more not tried' "$T/e15b"

check_report test_get_faults
