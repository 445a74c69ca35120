"""The ground floor: the frozen target, run folders and atomic writes, fingerprints, the machine, hf
compatibility and the named prompt sets. Imports nothing else of specheads but `version`.
"""
