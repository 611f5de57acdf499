#!/usr/bin/env bash
# device-prep.sh - run HERE (the build machine) before a `run` on the GPU
# machine: builds the CUDA binaries, and fills the git-ignored folders that
# travel with `carry`:
#   .devlib/bundle.tar.xz  (one file, ~9 MB; ~70 MB unpacked)
#       bin/   stripped salafw, bench_gpu, bench_batch, bench_gemm, bench_w8gemm, bench_attn and tests/gpu_* of a CUDA build (and
#              test_wide, for gpu-run.sh wide-ref), and the tests/gpu_*.sh scripts
#       lib/   shared libraries the GPU image lacks (libcjson)
#       cupti/ the kernel timeline library of gpu-run.sh trace and its libcupti
#       gold/  with --gold: the golden cases (config, weights, golden_bf16)
#              and the gpu_long CPU references (tests/data/gpu_long, scripts/long-ref.sh)
#       gpu_wide/  the CPU references of gpu_wide and the sha256 of the models'
#              shards they were made from (tests/data/gpu_wide, scripts/wide-ref.sh)
#   gpu-run.sh unpacks it there. xz matters: the fat CUDA binaries shrink 9x
#   and the bf16-valued F32 golden files 3x, under the 64 MiB carry limit.
#   .devlib-before/bundle.tar.xz  with --before REV: the same bundle (no gold)
#       of commit REV, built in a temporary worktree by REV's own
#       device-prep.sh, for `gpu-run.sh before-after` (carry both folders)
#   .devlib-x/bench_attn_NAME.xz  with --variant NAME FLAGS (after a plain
#       run, which builds build-cuda): this tree's bench_attn compiled with
#       the extra preprocessor FLAGS ("-DS1T_MINB=3 ..."), for `gpu-run.sh
#       variants` (carry .devlib-x too; each variant adds ~1.5 MB)
# Usage: scripts/device-prep.sh [--gold] [--no-build] [--before REV] [--variant NAME FLAGS]
# Then: run(command="bash scripts/gpu-run.sh ...", carry=[".devlib"])
set -euo pipefail
cd "$(dirname "$0")/.."
gold=0 build=1 failed= before=
vname="" vflags=""
while [ $# -gt 0 ]; do
	case $1 in
	--gold) gold=1 ;;
	--no-build) build=0 ;;
	--before) [ $# -ge 2 ] || { echo "$0: --before wants a revision" >&2; exit 2; }; before=$2; shift ;;
	--variant)
		[ $# -ge 3 ] || { echo "$0: --variant wants a name and its -D flags" >&2; exit 2; }
		vname=$2 vflags=$3
		shift 2 ;;
	*) echo "usage: $0 [--gold] [--no-build] [--before REV] [--variant NAME FLAGS]" >&2; exit 2 ;;
	esac
	shift
done
if [ -n "$vname" ]; then
	# a name for a file, and only -DNAME[=VALUE] flags (they reach the compilers' command lines)
	case $vname in *[!A-Za-z0-9_-]* | "") echo "$0: --variant: the name may hold letters, digits, _ and - only" >&2; exit 2 ;; esac
	macros=
	for f in $vflags; do
		case $f in
		-D[A-Za-z_]*) m=${f#-D} m=${m%%=*}
			case $m in *[!A-Za-z0-9_]*) echo "$0: --variant: '$f' is not a -DNAME[=VALUE] flag" >&2; exit 2 ;; esac
			case ${f#*=} in *[!A-Za-z0-9_.-]*) echo "$0: --variant: '$f': a value may hold letters, digits, _ . and - only" >&2; exit 2 ;; esac
			macros="$macros $m" ;;
		*) echo "$0: --variant: '$f' is not a -DNAME[=VALUE] flag" >&2; exit 2 ;;
		esac
	done
	[ -n "$macros" ] || { echo "$0: --variant: no -D flags" >&2; exit 2; }
	[ -x build-cuda/bench/bench_attn ] || { echo "$0: --variant: build-cuda has no bench_attn (run $0 first)" >&2; exit 2; }
	exclude=$(git rev-parse --git-common-dir)/info/exclude
	grep -qx "/.devlib-x/" "$exclude" 2>/dev/null || echo "/.devlib-x/" >>"$exclude"
	# (a failed build must not leave an older variant of this name to be timed)
	rm -f ".devlib-x/bench_attn_$vname" ".devlib-x/bench_attn_$vname.xz" ".devlib-x/$vname.flags"
	# build-cuda's objects, less those of the CUDA sources that name a
	# macro (make does not see a flag change), rebuilt with the flags
	vb=$(mktemp -d)
	cp -a build-cuda/. "$vb/"
	# The objects are named as make goals: make takes a missing object that
	# only an archive lists for an intermediate file, and would not rebuild
	# it while the archive is newer than its source.
	goals=
	for m in $macros; do
		for src in $(grep -lw "$m" kernels/*.cu kernels/*.cuh runner/*_cuda.c 2>/dev/null || true); do
			case $src in
			*.cuh) objs=$(ls kernels/*.cu | sed "s|^|$vb/|; s|\$|.o|") ;; # (the objects do not list their headers for this)
			*.cu) objs="$vb/$src.o" ;;
			*) objs="$vb/${src%.c}.o" ;;
			esac
			# shellcheck disable=SC2086 # $objs: a list
			rm -f $objs
			goals="$goals $objs"
		done
	done
	rm -f "$vb/bench/bench_attn"
	# shellcheck disable=SC2086 # $vflags: the flags, and $goals, split on purpose
	if ! make CUDA=1 CUDA_ARCH="${CUDA_ARCH:-sm_90}" BUILD="$vb" DEFS="-D_GNU_SOURCE -DSFW_HAVE_CUDA=1 $vflags" -j2 \
		$goals "$vb/bench/bench_attn" >/dev/null; then
		rm -rf "$vb"
		echo "device-prep: the variant $vname ($vflags) does not build" >&2
		exit 1
	fi
	# a variant that came out as this build's bench_attn did not take its flags
	if cmp -s "$vb/bench/bench_attn" build-cuda/bench/bench_attn; then
		rm -rf "$vb"
		echo "device-prep: the variant $vname ($vflags) is this build's bench_attn: the flags changed nothing" >&2
		exit 1
	fi
	mkdir -p .devlib-x
	strip -o ".devlib-x/bench_attn_$vname" "$vb/bench/bench_attn"
	xz -T2 -6 ".devlib-x/bench_attn_$vname"
	echo "$vflags" >".devlib-x/$vname.flags"
	rm -rf "$vb"
	echo "device-prep: .devlib-x/bench_attn_$vname.xz: bench_attn with $vflags"
	exit 0
fi
if [ -n "$before" ]; then
	rev=$(git rev-parse --verify --quiet "$before^{commit}") || { echo "$0: --before: '$before' is not a commit" >&2; exit 2; }
	exclude=$(git rev-parse --git-common-dir)/info/exclude
	grep -qx "/.devlib-before/" "$exclude" 2>/dev/null || echo "/.devlib-before/" >>"$exclude"
	# a shared clone, not a worktree: older scripts write to .git/info/exclude
	wt=$(mktemp -d)
	git clone -q --shared --no-checkout . "$wt" && git -C "$wt" checkout -q --detach "$rev"
	# REV's own script builds REV (its targets, its layout); its golden data is not needed
	(cd "$wt" && bash scripts/device-prep.sh) || echo "device-prep: the build of $rev reported a problem (see above)" >&2
	# only what gpu-run.sh before-after runs (the whole bundle would not fit
	# beside this tree's under the device tool's 64 MiB)
	rm -rf .devlib-before && mkdir -p .devlib-before "$wt/.b"
	tar -C "$wt/.b" -xJf "$wt/.devlib/bundle.tar.xz" ./bin/salafw ./bin/bench_gpu ./bin/bench_batch ./lib
	# bench_attn times the ops through the twins' signatures only: this
	# tree's source is built against REV, so both sides time the same ops
	# (skipped when those signatures differ there)
	cp bench/bench_attn.c "$wt/bench/"
	if make -C "$wt" CUDA=1 CUDA_ARCH="${CUDA_ARCH:-sm_90}" BUILD=build-cuda -j2 build-cuda/bench/bench_attn >/dev/null 2>&1; then
		strip -o "$wt/.b/bin/bench_attn" "$wt/build-cuda/bench/bench_attn"
	else
		echo "device-prep: bench_attn does not build against $rev (gpu-run.sh before-after attn will skip it)" >&2
	fi
	tar -C "$wt/.b" -cf - . | xz -T2 -6 >.devlib-before/bundle.tar.xz && echo "$rev" >.devlib-before/REV
	rm -rf "$wt"
	echo "device-prep: .devlib-before holds $rev"
	exit 0
fi
ARCH=${CUDA_ARCH:-sm_90}
# A build folder of its own: objects built without CUDA=1 (forward.c without
# SFW_HAVE_CUDA) must never be reused here.
BUILD=${BUILD:-build-cuda}
exclude=$(git rev-parse --git-common-dir)/info/exclude # (a worktree's .git is a file)
for d in .devlib $BUILD; do
	grep -qx "/$d/" .gitignore 2>/dev/null || grep -qx "/$d/" "$exclude" 2>/dev/null || echo "/$d/" >>"$exclude"
done
if [ $build = 1 ]; then
	# each target on its own: a broken file elsewhere must not stop the rest
	for t in $BUILD/salafw $BUILD/bench/bench_gpu $BUILD/bench/bench_batch $BUILD/bench/bench_gemm $BUILD/bench/bench_w8gemm $BUILD/bench/bench_attn $BUILD/tests/test_wide $(ls tests/gpu_*.c 2>/dev/null | sed "s|tests/\(.*\)\.c|$BUILD/tests/\1|"); do
		if ! make CUDA=1 CUDA_ARCH="$ARCH" BUILD="$BUILD" -j2 "$t" >/dev/null; then
			echo "device-prep: cannot build $t (skipped)" >&2
			failed="$failed $t"
			# an older binary of it must not travel as if it were this tree's
			rm -f "$t"
		fi
	done
fi
ST=.devlib/stage
rm -rf .devlib .devgold && mkdir -p $ST/bin $ST/lib
for b in "$BUILD/salafw" "$BUILD/bench/bench_gpu" "$BUILD/bench/bench_batch" "$BUILD/bench/bench_gemm" "$BUILD/bench/bench_w8gemm" "$BUILD/bench/bench_attn" "$BUILD/tests/test_wide" "$BUILD"/tests/gpu_*; do
	case $b in *.o | *.d) continue ;; esac
	[ -x "$b" ] || continue
	strip -o "$ST/bin/$(basename "$b")" "$b"
done
# the kernel timeline library (gpu-run.sh trace) and the CUPTI it was linked with
if [ $build = 1 ]; then
	make CUDA=1 CUDA_ARCH="$ARCH" BUILD="$BUILD" cupti-trace >/dev/null || echo "device-prep: cannot build cupti-trace (skipped)" >&2
fi
if [ -f "$BUILD/bench/libsfw_cupti_trace.so" ]; then
	mkdir -p $ST/cupti
	strip -o $ST/cupti/libsfw_cupti_trace.so "$BUILD/bench/libsfw_cupti_trace.so"
	cp -L "${CUDA_HOME:-/usr/local/cuda}/lib64/libcupti.so.13" $ST/cupti/ 2>/dev/null || true
fi
# the GPU tests written as scripts (gpu-run.sh tests runs every bin/gpu_*)
for f in tests/gpu_*.sh; do
	[ -f "$f" ] && install -m 755 "$f" "$ST/bin/"
done
# Libraries the GPU image lacks (it has libcurl, libcrypto/libssl and
# sentencepiece; Ubuntu 24.04, seen 2026-11-30): only cJSON and (for serve) libmicrohttpd. DEVLIB_ALL=1
# copies every non-glibc, non-CUDA library instead (~19 MB).
# (the bin/ scripts are no ELF files: ldd fails on them, and pipefail would end the script)
for b in $ST/bin/*; do case $b in *.sh) ;; *) ldd "$b" ;; esac; done | awk '/=> \//{print $3}' | sort -u | while read -r lib; do
	n=$(basename "$lib")
	case $n in
	libc.so* | libm.so* | libpthread.so* | libdl.so* | librt.so* | ld-linux* | libstdc++.so* | libgcc_s.so* | \
		libcuda.so* | libcudart.so* | libcublas*.so* | libnvidia*) continue ;;
	esac
	case $n in
	libcjson* | libmicrohttpd* | libunistring*) cp -L "$lib" $ST/lib/ ;; # (libmicrohttpd's gnutls: libcurl's librtmp has it there)
	*) if [ "${DEVLIB_ALL:-0}" = 1 ]; then cp -L "$lib" $ST/lib/; fi ;; # (an && here ends the loop with 1 under set -e)
	esac
done
# gpu_wide's CPU references (~1.7 MB, made ahead by scripts/wide-ref.sh)
mkdir -p $ST/gpu_wide
for r in tests/data/gpu_wide/*; do
	if [ -f "$r" ]; then cp "$r" $ST/gpu_wide/; fi
done
if [ $gold = 1 ]; then
	G=${SALAFW_GOLDEN:-../shared/golden}
	mkdir -p $ST/gold
	cp "$G/README.md" $ST/gold/
	for c in "$G"/*/; do
		n=$(basename "$c")
		mkdir -p "$ST/gold/$n"
		cp "$c/config.json" "$c/model.safetensors" "$c/golden_bf16.safetensors" "$ST/gold/$n/"
	done
	# CPU references of gpu_long made ahead by scripts/long-ref.sh
	for r in tests/data/gpu_long/long-*.ref; do
		[ -f "$r" ] && cp "$r" $ST/gold/
	done
fi
tar -C $ST -cf - . | xz -T1 --lzma2=preset=1,dict=192MiB >.devlib/bundle.tar.xz # (a window over several binaries: their fat CUDA code repeats)
rm -rf $ST
ls -la .devlib
if [ -n "${failed:-}" ]; then
	echo "device-prep: packed, but these did not build and are missing:$failed" >&2
	exit 1
fi
# the device tool carries at most 64 MiB
size=$(stat -c %s .devlib/bundle.tar.xz)
if [ "$size" -gt $((60 << 20)) ]; then
	echo "device-prep: .devlib/bundle.tar.xz is $((size >> 20)) MiB, too close to the device tool's 64 MiB limit" >&2
	exit 1
fi
