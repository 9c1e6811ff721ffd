from parley.gateway.fake_provider.server import main

main()
