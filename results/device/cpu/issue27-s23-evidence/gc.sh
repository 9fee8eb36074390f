for r in 1 2; do
  for G in "" 1; do
    for L in standard mhc; do
      echo "$r nogc=$G $(NOGC=$G ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 python one.py $L 2>/dev/null | tail -1)"
    done
  done
done
