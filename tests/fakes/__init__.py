"""Fake GPU libraries for the CPU tests: each records the calls it gets and computes, with torch,
the answer the real library would give from exactly those arguments."""
