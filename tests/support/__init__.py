"""Helpers shared by the tests of both lanes (``tests/unit``, ``tests/integration``): Kineto trace
builders (``kineto``), N gloo ranks (``dist``), fresh processes (``procs``), the dashboard's test
store (``stores``), a headless Chromium over CDP (``cdp``), ..."""
