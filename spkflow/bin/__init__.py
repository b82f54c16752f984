"""Command-line front ends: ``python -m spkflow.bin.NAME``; argument parsing only."""
