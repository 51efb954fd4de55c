"""`python -m terra_nb.bench ...`: the benchmark's command line (`cli`)."""
from terra_nb.bench.cli import main

if __name__ == "__main__":
    main()
