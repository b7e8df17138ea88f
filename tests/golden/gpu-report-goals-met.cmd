python3 tests/gpu/report.py tests/gpu/report/goals-met.json
