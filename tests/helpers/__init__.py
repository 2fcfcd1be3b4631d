"""What several test files share: the browser harness, the app's AppTest steps, the tiny long-attention models,
the scan and routes fixtures. No test file imports another (tests/test_test_imports.py): they import these."""
