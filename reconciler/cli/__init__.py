"""The command line: argument parsing, composition of the engine's parts, rendering, exit codes.

The engine below this package never prints or exits; everything a user reads is written here.
"""
