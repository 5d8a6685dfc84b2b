"""What a run reports about itself: the profiler (profiler.py), TensorBoard (tensorboard.py), the memory
report (memory.py) and efficiency (efficiency.py); run.py makes the callbacks a run asks for and finishes
them. A component that is off is never created.
"""
