python3 tests/gpu/report.py tests/gpu/report/first-h200.json
