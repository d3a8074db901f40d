"""Stragglers: who arrived last and what it cost (:mod:`.identify`), why the straggler was late
(:mod:`.causes`: its data, GC, a preempted CPU), and how much of the wait the input data
explains (:mod:`.attribution`)."""
