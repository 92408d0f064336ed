"""One module per notebook: each checks its parameters once (through `context`), measures what
its run lacks, and fills a `page` of prose, tables and figures from fp4lab.analysis. The notebook
shows the page section by section; the report, the front page and the share file reuse the
modules' sentences, so no number is stated two ways."""

from fp4lab.chapters import (ch00_environment, ch01_gemm, ch02_power, ch03_moe, ch04_diagnosis,
                             ch05_comm, ch06_history)

CHAPTERS = {
    "00_environment": ch00_environment,
    "01_fp4_gemm_sweep": ch01_gemm,
    "02_power_clocks": ch02_power,
    "03_moe_expert_scatter": ch03_moe,
    "04_diagnosis": ch04_diagnosis,
    "05_comm_layouts": ch05_comm,
    "06_history": ch06_history,
}
