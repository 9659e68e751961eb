"""matmul_backward through torch: the two products torch's autograd computes for
torch.matmul, called directly -- the backward alone, without recomputing the forward.

For y = torch.matmul(a, b) autograd runs grad_a = dy @ b^T and grad_b = a^T @ dy over the
broadcast batch, then sums each over the batch dims its operand was expanded along
(sum_to_size), exactly as here.  float32 runs as IEEE float32 unless the user enabled
TF32 (torch.backends.cuda.matmul.allow_tf32, off by default): the baseline leaves that
setting alone, so a TF32-enabled process fails the float32 cases, as it should.
"""
OP = "matmul_backward"


def backward(inputs, params):
    import torch

    a, b, dy = inputs["a"], inputs["b"], inputs["dy"]
    da = torch.matmul(dy, b.mT)
    db = torch.matmul(a.mT, dy)
    if da.shape != a.shape:
        da = da.sum_to_size(a.shape)
    if db.shape != b.shape:
        db = db.sum_to_size(b.shape)
    return {"da": da, "db": db}
