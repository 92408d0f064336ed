"""MoE expert scatter: model presets, routing models, load statistics, grouped GEMMs, layer model.

`presets` (model shapes), `routing` (who picks which expert), `stats` (mean vs busiest expert
and EP rank), `grouped` (loop / grouped / padded expert GEMMs measured at those loads),
`layer_model` (the MoE layer's time predicted from dense GEMM curves).
"""
