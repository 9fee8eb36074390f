# rounds of two fresh processes, standard then mhc (order alternating by round), one model each
for r in 1 2 3 4 5 6; do
  if [ $((r % 2)) -eq 1 ]; then order="standard mhc"; else order="mhc standard"; fi
  for L in $order; do ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 python one.py $L 2>/dev/null | tail -1 | sed "s/^/$r /"; done
done
