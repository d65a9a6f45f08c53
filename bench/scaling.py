"""A generated training module of any size, for checking that linting stays linear.

Every block is one self-contained training script wrapped in a function of its own
(model, loaders, sampler, dataset with a generator, scheduler, accumulation, an
evaluation pass, a process launch), so each block gives the analysis the same work and
a file of ``n`` blocks should cost ``n`` times one block. ``tests/test_lint_scaling.py``
counts the calls a lint makes on 1x and 5x; ``bench/bench_lint.py --scaling`` times a
10k-line and a 50k-line file.
"""

from __future__ import annotations

BLOCK = '''
def script_{i}(args, world):
    import numpy as np
    import torch.multiprocessing as mp
    from torch import nn
    from torch.utils.data import DataLoader, Dataset, DistributedSampler

    class Jitter{i}(Dataset):
        def __init__(self, items):
            self.items = items
            self.rng = np.random.RandomState(0)

        def __len__(self):
            return len(self.items)

        def __getitem__(self, k):
            return self.items[k] + self.rng.normal()

    class Net{i}(nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = [nn.Linear(8, 8) for _ in range(3)]
            self.head = nn.Linear(8, 2)

        def forward(self, x):
            for block in self.blocks:
                x = block(x)
            return self.head(x).softmax(-1)

    def evaluate_{i}(net, loader):
        net.eval()
        hits = 0
        for x, y in loader:
            hits += (net(x).argmax(1) == y).sum().item()
        return hits

    def worker_{i}(net, loader):
        for x, y in loader:
            net(x).sum().backward()

    net = Net{i}().to(args.device)
    data = Jitter{i}(list(range(64)))
    sampler = DistributedSampler(data)
    train_loader = DataLoader(data, batch_size=8, sampler=sampler, num_workers=2)
    val_loader = DataLoader(data, batch_size=8, shuffle=True)
    opt = torch.optim.SGD(net.parameters(), lr=args.lr / args.accum)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=args.epochs)
    losses = []
    for epoch in range(args.epochs):
        for step, (x, y) in enumerate(train_loader):
            loss = nn.functional.cross_entropy(net(x.to(args.device)), y.to(args.device))
            loss.backward()
            if (step + 1) % args.accum == 0:
                opt.step()
                opt.zero_grad()
            sched.step()
            losses.append(loss)
        evaluate_{i}(net, val_loader)
    proc = mp.Process(target=worker_{i}, args=(net, train_loader))
    proc.start()
    proc.join()
    return net
'''


def module(blocks: int) -> str:
    """The source of a module of ``blocks`` training scripts."""
    return "import torch\n" + "".join(BLOCK.format(i=i) for i in range(blocks))
