"""Tests of the operations helpers: logging, locks, secrets kept out of logs."""
