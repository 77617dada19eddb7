"""Generated protobuf code for the Offerbus wire protocol (`make proto`); sources are *.proto."""
