"""pairs.py with extra S.rblock depths in the space (env RBLOCK_DEPTHS=8,16,32,...)."""
import os, runpy, sys
import kdsl.codegen.tvm.schedule_space as ss, kdsl.codegen.tvm.space_memory as sm
depths = tuple(int(n) for n in os.environ.get("RBLOCK_DEPTHS", "16,32,64,128,256,512,1024").split(","))
ss.RBLOCK_DEPTHS = sm.RBLOCK_DEPTHS = depths
sys.argv = ["pairs.py", *sys.argv[1:]]
runpy.run_path(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "suites_2026-11-29b", "pairs.py"), run_name="__main__")
