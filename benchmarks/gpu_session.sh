#!/usr/bin/env bash
# One device call: environment, GPU tests, and every GPU benchmark; logs and tables under $OUT.
# Usage (on the GPU machine, from the repo root): bash benchmarks/gpu_session.sh [parts...]
set -u
export PYTHONPATH=.:tests PYTHONUNBUFFERED=1 FUSETREE_CACHE_DIR=/tmp/ftcache
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
parts=${*:-"env sanity tests host bandwidth compile lstm"}
# every GPU feature once (the quick subset), for "gputests_quick" (one process) and "quickp" (processes side by side)
QUICK_K=${QUICK_K:-"arithmetic_views or repeated_gemms or transposed_tiles or lstm or interop or launch or cache or float16_and_bool or reduction_kinds_once or jit or graph or in_place or element_reads or program_fuzzer or bound or pytrees or horizontal or deep_chains or autodiff or char_lstm or wide_access or too_many_inputs or (add and float16) or (add and float32) or (sigmoid and float32) or recomputing"}
run() { local name=$1; shift; echo "=== $name"; local t=$SECONDS; timeout "${LIMIT:-300}" "$@" > "$OUT/$name.log" 2>&1; local rc=$?; echo "[$name rc=$rc $((SECONDS-t))s]"; tail -n "${TAILN:-25}" "$OUT/$name.log"; }
for p in $parts; do
  case $p in
    # the C front end (fusetree/_native.c): built here when a compiler is present, else the carried build
    native) (command -v gcc && python3 setup.py -q build_ext --inplace) > "$OUT/native_build.log" 2>&1; tail -3 "$OUT/native_build.log"
      python3 -c "import fusetree.ir.node as n; print('front end:', n.NATIVE)";;
    # host cost with the C front end and without it (FUSETREE_NATIVE=0), same machine
    hostab) for n in 1 0; do FUSETREE_NATIVE=$n LIMIT=150 TAILN=28 run "host_native$n" python3 benchmarks/host_overhead.py --device cuda --json "$OUT/host_gpu_native$n.json"; done;;
    fronttests) LIMIT=${FRONT_LIMIT:-170} TAILN=6 run fronttests python3 -m pytest -m gpu -q -p no:cacheprovider -W ignore::DeprecationWarning tests/test_gpu.py tests/test_jit.py -k "${FRONT_K:-lstm_step or jit or graph_mode or in_place or element_reads or autodiff}";;
    optsmall) LIMIT=${OPT_LIMIT:-120} TAILN=9 run optsmall python3 benchmarks/optimizer.py --device cuda --models small --steps 3 --repeats 5 --json "$OUT/optimizer_small_gpu.json";;
    env) nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv; python3 -c "import numpy, numba, numba_cuda, cupy, torch, sys; print(sys.version.split()[0], numpy.__version__, numba.__version__, numba_cuda.__version__, cupy.__version__, torch.__version__)";;
    sanity) run sanity python3 -c "
import numpy as np, cupy as cp, fusetree as ft
from lstm_ref import lstm_step, make_inputs, reference, rel_err
inp = make_inputs(np.random.default_rng(0), 128, 512)
h2, c2 = lstm_step(*(ft.asarray(cp.asarray(a)) for a in inp), xp=ft)
ft.reset_stats(); ft.evaluate(h2, c2); print(ft.stats())
hr, cr = reference(*inp); print('rel_err', rel_err(h2.numpy(), hr), rel_err(c2.numpy(), cr))
print(ft.explain(ft.exp(ft.asarray(cp.ones(4, cp.float32))) + 1).kernels[0].source)";;
    # the whole GPU suite compiles ~2,500 kernels (~25 min in one process): "suite" runs it as
    # SUITE_PROCS (14) pytest processes side by side, heaviest tests dealt first (stop 31, H100: 14
    # processes of round-robin slices were still running at 570 s; logs tarred in suite_logs.tgz);
    # SUITE_PART=K-L/N runs only those round-robin slices; suite1 .. suite4: a quarter in one process
    suite) LIMIT=${SUITE_LIMIT:-560} TAILN=40 run suite python3 benchmarks/gpu_suite_slice.py --procs "${SUITE_PROCS:-14}" --logs "$OUT/suite" --deadline $(( ${SUITE_LIMIT:-560} - 25 )) ${SUITE_PART:+--part $SUITE_PART}; (cd "$OUT" && tar czf suite_logs.tgz suite && rm -rf suite);;
    suite1|suite2|suite3|suite4) LIMIT=${SUITE_LIMIT:-560} TAILN=25 run "$p" python3 benchmarks/gpu_suite_slice.py "${p#suite}" 4;;
    tests) LIMIT=420 TAILN=40 run tests python3 -m pytest -m gpu -q -p no:cacheprovider -x --maxfail=5 -W ignore::DeprecationWarning tests/test_gpu.py;;
    # every GPU feature once ($QUICK_K: one float16 op, one reduction dtype, 8 fuzzed programs; it
    # was >360 s on a cold H100 in one process at 26 tests, compiling dominates; "quickp" runs the
    # same selection side by side); the random-tree fuzzer and every op x dtype run in "suite"
    gputests_quick) FUSETREE_GPU_PROGRAMS=${FUSETREE_GPU_PROGRAMS:-8} LIMIT=540 TAILN=12 run gputests_quick python3 -m pytest -m gpu -v -p no:cacheprovider -W ignore::DeprecationWarning tests/test_gpu.py tests/test_jit.py -k "$QUICK_K";;
    quickp) LIMIT=${QUICK_LIMIT:-330} TAILN=45 run quickp python3 benchmarks/gpu_suite_slice.py --procs "${SUITE_PROCS:-14}" --logs "$OUT/quickp" --deadline $(( ${QUICK_LIMIT:-330} - 20 )) -k "$QUICK_K"; (cd "$OUT" && tar czf quickp_logs.tgz quickp && rm -rf quickp);;
    fuzzprog) LIMIT=${FUZZ_LIMIT:-300} TAILN=15 run fuzzprog python3 benchmarks/fuzz.py --programs --device cuda --n ${FUZZ_N:-5000} --jobs ${FUZZ_JOBS:-12};;
    cputests) LIMIT=400 run cputests python3 -m pytest -q -p no:cacheprovider tests/test_lstm.py tests/test_cache.py tests/test_api.py;;
    profile) TAILN=150 run profile python3 benchmarks/profile_step.py cuda 128x512;;
    # the eager LSTM step's phases, views bound by arithmetic (ViewLeaf) and as CuPy view objects
    phases1) for v in "" --view-objects; do LIMIT=90 TAILN=9 run "phases${v:+_objects}" python3 benchmarks/step_phases.py --device cuda --shape 128x512 $v; done;;
    phases) for v in "" --view-objects "" --view-objects; do LIMIT=90 TAILN=9 run "phases${v:+_objects}" python3 benchmarks/step_phases.py --device cuda --shape 128x512 $v; done;;
    gemm) run gemm python3 benchmarks/gemm_host.py;;
    probe) LIMIT=60 TAILN=12 run probe python3 benchmarks/probe_graph.py;;
    gemmk) LIMIT=90 TAILN=8 run gemm_kernels python3 benchmarks/gemm_kernels.py;;
    transpose) LIMIT=150 TAILN=20 run probe_transpose python3 benchmarks/probe_transpose.py;;
    copies) LIMIT=120 TAILN=30 run probe_copies python3 benchmarks/probe_copies.py --device cuda;;
    breakdown) LIMIT=120 TAILN=20 run host_breakdown python3 benchmarks/host_breakdown.py --device cuda;;
    hostprof) LIMIT=150 TAILN=80 run host_profile python3 benchmarks/host_profile.py --device cuda --n 2000 --top 16;;
    launch) LIMIT=150 TAILN=8 run launch_costs python3 benchmarks/launch_costs.py;;
    host) TAILN=40 run host python3 benchmarks/host_overhead.py --device cuda --json "$OUT/host_gpu.json";;
    bandwidth) LIMIT=${BW_LIMIT:-300} TAILN=60 run bandwidth python3 benchmarks/bandwidth.py ${BW_ARGS:-} --json "$OUT/bandwidth_gpu.json";;
    final15) LIMIT=300 TAILN=30 run final15 python3 -m pytest -m gpu -q -p no:cacheprovider -W ignore::DeprecationWarning tests/test_gpu.py -k "wide_access or graph_lstm or jit_lstm or lstm_step or float16_and_bool or graph_mode or horizontal";;
    optim) LIMIT=${OPT_LIMIT:-300} TAILN=20 run optim python3 benchmarks/optimizer.py --device cuda --steps 3 --repeats 5 --json "$OUT/optimizer_gpu.json";;
    wide) LIMIT=300 TAILN=12 run wide python3 -m pytest -m gpu -q -p no:cacheprovider -x -W ignore::DeprecationWarning tests/test_gpu.py -k "wide_access or large_reductions or reduction_patterns";;
    compile) run compile python3 benchmarks/compile_time.py;;
    tile64) FUSETREE_CUDA_TILE=64 LIMIT=200 TAILN=20 run tile64_check python3 -c "import numpy as np, vector_cases as vc; print('checked', vc.check_transposed('cuda', np.random.default_rng(0), big=True))"
      FUSETREE_CUDA_TILE=64 LIMIT=200 TAILN=30 run bandwidth_t64 python3 benchmarks/bandwidth.py --no-torch;;
    bwu) for u in 2 4; do FUSETREE_CUDA_UNROLL=$u LIMIT=150 TAILN=24 run bandwidth_u$u python3 benchmarks/bandwidth.py --no-torch; done;;
    lstm) LIMIT=500 TAILN=45 run lstm python3 benchmarks/lstm.py --device cuda --json "$OUT/lstm_gpu.json" --plot "$OUT/lstm_gpu.png";;
    redtests) LIMIT=420 TAILN=30 run redtests python3 -m pytest -m gpu -q -p no:cacheprovider -x -W ignore::DeprecationWarning tests/test_gpu.py -k "reduction or graph or two_stage";;
    graphtest) LIMIT=120 TAILN=6 run graphtest python3 -m pytest -m gpu -q -p no:cacheprovider -W ignore::DeprecationWarning tests/test_gpu.py -k "graph or jit";;
    redheld) for h in 8 16 32; do FUSETREE_REDUCE_HELD=$h LIMIT=120 TAILN=12 run redheld_$h python3 benchmarks/reductions.py --device cuda --shapes 4096x4096,64x128x1024; done;;
    # launch shapes of the row reductions at (4096, 4096): held elements x rows per block
    probered) LIMIT=${PROBE_LIMIT:-300} TAILN=80 run probe_reductions python3 benchmarks/probe_reductions.py ${PROBE_ARGS:-};;
    # the reduction kernels under Nsight Compute (occupancy, stall reasons), torch's and a copy beside them
    ncured) echo "=== ncured"; timeout ${NCU_LIMIT:-150} ncu --clock-control none --profile-from-start off --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section SchedulerStats python3 benchmarks/ncu_reductions.py > "$OUT/ncu_reductions.txt" 2>&1; echo "[ncured rc=$?]"
      grep -E "launch:|Duration|Registers Per|Achieved Occupancy|Theoretical Occupancy|Memory Throughput|DRAM Throughput|Block Limit Reg|Warp Cycles Per Issued|No Eligible|Active Warps Per" "$OUT/ncu_reductions.txt" | head -120;;
    reductions) LIMIT=400 TAILN=70 run reductions python3 benchmarks/reductions.py --device cuda --json "$OUT/reductions_gpu.json";;
    fuzz) LIMIT=${FUZZ_LIMIT:-300} TAILN=15 run fuzz python3 benchmarks/fuzz.py --device cuda --n ${FUZZ_N:-2000} --jobs ${FUZZ_JOBS:-12};;
    lstmseq) LIMIT=${SEQ_LIMIT:-300} TAILN=40 run lstmseq python3 benchmarks/lstm.py --device cuda --configs 64x512,128x512 --modes fusetree,fusetree-jit,fusetree-graph,cupy-handwritten,torch-lstmcell,torch-compile --json "$OUT/lstm_seq_gpu.json";;
    lstmh) LIMIT=300 TAILN=30 run lstmh python3 benchmarks/lstm.py --device cuda --configs 64x512,128x512 --no-sequence --modes fusetree,fusetree-jit,fusetree-graph,cupy-unfused,cupy-handwritten,torch-lstmcell --json "$OUT/lstm_h.json";;
    autodiff) LIMIT=300 TAILN=8 run autodiff python3 -m pytest -m gpu -q -p no:cacheprovider -W ignore::DeprecationWarning tests/test_gpu.py -k "autodiff or char_lstm";;
    train) LIMIT=${TRAIN_LIMIT:-400} TAILN=14 run train python3 benchmarks/train_lstm.py --device cuda --steps ${TRAIN_STEPS:-5} --repeats 3 --check 5 --curve ${TRAIN_CURVE:-150} --plot "$OUT/train_gpu.png" --json "$OUT/train_gpu.json";;
    lstmq) LIMIT=300 TAILN=45 run lstmq python3 benchmarks/lstm.py --device cuda --configs 64x512,128x512 --modes fusetree,fusetree-jit,fusetree-unfused,cupy-unfused,cupy-fuse,cupy-handwritten,torch-eager,torch-lstmcell --json "$OUT/lstm_gpu.json";;
  esac
done
