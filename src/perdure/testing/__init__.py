"""Test doubles and the store conformance suite, for perdure's tests and yours."""
