"""Another job on the same GPU (for .ci/gpu): hold all of its free memory but argv[1] GiB until killed,
then touch argv[2]."""
import sys
import time

import torch

keep = int(float(sys.argv[1]) * 2**30)
free, total = torch.cuda.mem_get_info(torch.device("cuda", 0))
held = torch.empty(max(0, free - keep), dtype=torch.uint8, device=torch.device("cuda", 0))
free_now = torch.cuda.mem_get_info(torch.device("cuda", 0))[0]
print(f"another process holds {held.numel() / 2**30:.2f} GiB of {total / 2**30:.2f}; {free_now / 2**30:.2f} GiB free",
      flush=True)
open(sys.argv[2], "w").close()
time.sleep(1800)
