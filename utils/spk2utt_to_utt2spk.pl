#!/usr/bin/env perl
# Converts spk2utt ("<spk> <utt1> <utt2> ...") to utt2spk ("<utt> <spk>" per line),
# in spk2utt order.
#
# Usage: spk2utt_to_utt2spk.pl [spk2utt] > utt2spk      (reads stdin without a file)
#
# A speaker with no utterances is an error naming the file and line; nothing is
# printed then (the output is all or nothing).
use strict;
use warnings;

if (@ARGV > 1 || (@ARGV == 1 && $ARGV[0] =~ /^--?h(elp)?$/)) {
    die "Usage: spk2utt_to_utt2spk.pl [spk2utt] > utt2spk\n";
}

my @out;
while (my $line = <>) {
    my @f = split(" ", $line);
    if (@f < 2) {
        my $name = ($ARGV eq "-" ? "stdin" : $ARGV);
        chomp $line;
        die "$0: $name:$.: expected '<spk> <utt1> [<utt2> ...]', got '$line'\n";
    }
    my $spk = shift @f;
    push @out, "$_ $spk\n" for @f;
}
print @out;
