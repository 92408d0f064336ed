"""The MoE model (numpy only): model presets, routing models, load statistics, layer model.

`presets` (model shapes), `routing` (who picks which expert), `stats` (mean vs busiest expert
and EP rank), `layer_model` (the MoE layer's time predicted from one expert's dense GEMM curve).
The methods that run expert GEMMs live in `fp4lab.backends.moe`; the sweep in `fp4lab.sweep.moe`.
"""
