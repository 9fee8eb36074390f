for r in 1 2; do
  for T in 0 1; do
    for L in standard mhc; do
      echo "$r thp=$T $(THP_MEM_ALLOC_ENABLE=$T ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 python one.py $L 2>/dev/null | tail -1)"
    done
  done
done
