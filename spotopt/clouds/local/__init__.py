"""The local machine: the provider that runs jobs as real processes, named by its entry in
``spotopt.clouds.registry``; nothing is imported here."""
