"""What a run picks for the machine it runs on: the precision and attention kernel of precision ``auto`` (``modes``,
with the packaged CPU table ``modes_cpu.json``), glibc's ``malloc`` for a CPU run (``allocator``), and the paired
step timing both the modes' measurement and the benchmark use (``timing``). Importing the package loads nothing
heavy."""
