"""Reading weight and dump files, bounded and validated: selective safetensors reads (``tensorstore``) and
safe ``torch.save`` files (``torchfile``). The lowest floor of the evaluator: imports nothing of it but errors."""
