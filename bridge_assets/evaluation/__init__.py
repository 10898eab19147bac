"""Labeler evaluation on gold sets: LLMJudge, LARA-style escalation, DREAM (with its
ablations), a DIRAS-style calibrated scorer and utility labels (UtilSel / UtilRank), each
scored with class recalls, bAcc, escalation ratio, calibration and cost.

Plain functions (goldsets, metrics, lara, diras, utility, runner, plots) that know nothing of
Dagster; `assets.py` wires them into the `labeler_eval` asset group and `cli.py` into
`bridge label-eval`.
"""
