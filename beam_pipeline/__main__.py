from beam_pipeline.cli import console

console()
