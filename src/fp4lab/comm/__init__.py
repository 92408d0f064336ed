"""Communication measurements: what TP, EP and PP decode cost between GPUs.

`python -m fp4lab comm` runs ranks under torchrun (NCCL on GPUs, gloo on CPUs) over a declared
sweep (`plan`): all-reduce of TP activations, all-to-all dispatch and combine at EP decode sizes
with the routing's uneven splits (`splits`), send/recv of PP stage activations (`ops` for the
byte and bandwidth definitions, `collectives` for the calls). `runner` is the rank loop and
`watchdog` the fault handling; `launch` starts torchrun and gives the verdict; `rows` builds the
`comm` table. Modules import torch only where they run collectives.
"""
