"""The one harness that verifies, benchmarks and profiles any registered convolution implementation."""
